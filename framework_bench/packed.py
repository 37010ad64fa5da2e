"""The packed-data format on disk, shared by the host (writer) and every worker (reader).

Stdlib + numpy only: workers import this inside each backend's own environment.

A packed folder holds:
  manifest.json    context_length, rows, tokens, documents, sha256, tokenizer, sources...
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


def sha256_of(input_ids: np.ndarray) -> str:
    """The identity of a packed stream: sha256 of its shape (rows x context) and of its token
    ids as little-endian int32; the same tokens cut into other rows are another stream."""
    h = hashlib.sha256(f"{tuple(input_ids.shape)}".encode())
    flat = np.ascontiguousarray(input_ids, dtype="<i4").reshape(-1)
    step = 1 << 24  # hash in 64 MiB slices so a memory-mapped stream is never copied whole
    for i in range(0, flat.size, step):
        h.update(flat[i : i + step].tobytes())
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
        return sha256_of(self.input_ids)

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
