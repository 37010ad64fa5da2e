"""The packed-data format on disk, shared by the host (writer) and every worker (reader).

Stdlib + numpy only: workers import this inside each backend's own environment.

A packed folder holds:
  manifest.json    context_length, rows, tokens, documents, sha256, tokenizer, sources,
                   files (every other file's size and sha256, checked when the cache is reused)
  input_ids.npy    int32 [rows, context_length]
  labels.npy       int32 [rows, context_length]; -100 where no loss is taken (prompts)
  doc_starts.npy   int64 [documents]; offsets of document starts in the flattened rows
  tokenizer/       tokenizer.json + tokenizer_config.json, loadable by transformers
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

IGNORE_INDEX = -100
MANIFEST = "manifest.json"
INPUT_IDS = "input_ids.npy"
LABELS = "labels.npy"
DOC_STARTS = "doc_starts.npy"
TOKENIZER_DIR = "tokenizer"


def _update(h, array: np.ndarray, dtype: str) -> None:
    """Feed `array` (its shape, then its values as `dtype`) to `h`, in 64 MiB slices so a
    memory-mapped array is never copied whole."""
    h.update(f"{tuple(array.shape)}".encode())
    flat = np.ascontiguousarray(array, dtype=dtype).reshape(-1)
    step = (64 << 20) // flat.itemsize
    for i in range(0, flat.size, step):
        h.update(flat[i : i + step].tobytes())


def sha256_of(array: np.ndarray) -> str:
    """sha256 of one int32 array: its shape, then its values as little-endian int32."""
    h = hashlib.sha256()
    _update(h, array, "<i4")
    return h.hexdigest()


def stream_sha256(input_ids: np.ndarray, labels: np.ndarray, doc_starts: np.ndarray) -> str:
    """The identity of a packed stream: every array a worker reads, with its shape (the same
    tokens cut into other rows, or with other labels or document boundaries, are another stream)."""
    h = hashlib.sha256()
    _update(h, input_ids, "<i4")
    _update(h, labels, "<i4")
    _update(h, doc_starts, "<i8")
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(16 << 20):
            h.update(chunk)
    return h.hexdigest()


class PackedRows:
    """Read-only view of a packed folder (memory-mapped)."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.manifest = json.loads((self.dir / MANIFEST).read_text())
        self.input_ids = np.load(self.dir / INPUT_IDS, mmap_mode="r")
        self.labels = np.load(self.dir / LABELS, mmap_mode="r")
        self.doc_starts = np.load(self.dir / DOC_STARTS, mmap_mode="r")

    @property
    def context_length(self) -> int:
        return int(self.manifest["context_length"])

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def tokenizer_dir(self) -> Path:
        return self.dir / TOKENIZER_DIR

    def sha256(self) -> str:
        return stream_sha256(self.input_ids, self.labels, self.doc_starts)

    def segment_ids(self, row: int) -> np.ndarray:
        """Document number within the row, 1..k, for each position (varlen attention masks)."""
        ctx = self.context_length
        lo, hi = row * ctx, (row + 1) * ctx
        starts = np.asarray(self.doc_starts)
        inside = starts[(starts > lo) & (starts < hi)] - lo
        seg = np.zeros(ctx, dtype=np.int32)
        seg[inside] = 1
        return np.cumsum(seg, dtype=np.int32) + 1

    def cu_seqlens(self, row: int) -> np.ndarray:
        """Cumulative document lengths within the row, [0, ..., context_length] (flash-attn varlen)."""
        seg = self.segment_ids(row)
        cuts = np.flatnonzero(np.diff(seg)) + 1
        return np.concatenate([[0], cuts, [self.context_length]]).astype(np.int32)
