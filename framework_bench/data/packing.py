"""Pack Alpaca once into rows of exactly `context_length` tokens, cached on disk.

The stream is: for each record, <s> prompt response </s>, concatenated; labels are -100
over <s> and the prompt. The stream is repeated when the run needs more tokens than the
dataset holds, then cut into full rows (the tail that does not fill a row is dropped).
All work after tokenization is vectorised numpy, written copy by copy into the output
files, so no output-sized array is ever held in memory.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import Progress

from framework_bench.worker import packed
from framework_bench.data import alpaca, tokenizer as tokenizers_
from framework_bench.scenario import catalog
from framework_bench.envs.venvs import fbench_home
from framework_bench.scenario.scenario import Scenario

FORMAT_VERSION = 3  # 2: sha256 covers the row shape; 3: and labels and document starts; files listed
FREE_SPACE_MARGIN = 1 << 30  # left free after packing, for the run folders and the store
_ENCODE_CHUNK = 1000


@dataclass
class Stream:
    """One copy of the dataset as flat arrays."""

    input_ids: np.ndarray  # int32 [tokens]
    labels: np.ndarray  # int32 [tokens]
    doc_lengths: np.ndarray  # int64 [documents]


@dataclass
class PackedData:
    dir: Path
    manifest: dict
    cached: bool = False

    @property
    def sha256(self) -> str:
        return self.manifest["sha256"]


def tokenize(tok, records: list[dict], progress: Progress | None = None) -> Stream:
    bos = tokenizers_.special_id(tok, "<s>", "<|begin_of_text|>")
    eos = tokenizers_.special_id(tok, "</s>", "<|end_of_text|>", "<|endoftext|>")
    pairs = [alpaca.format_record(r) for r in records]
    prompts, responses = [], []
    task = progress.add_task("tokenizing", total=len(pairs)) if progress else None
    for i in range(0, len(pairs), _ENCODE_CHUNK):
        chunk = pairs[i : i + _ENCODE_CHUNK]
        prompts += [e.ids for e in tok.encode_batch([p for p, _ in chunk], add_special_tokens=False)]
        responses += [e.ids for e in tok.encode_batch([r for _, r in chunk], add_special_tokens=False)]
        if progress:
            progress.advance(task, len(chunk))
    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    ids, labels, lengths = [], [], []
    for p, r in zip(prompts, responses):
        ids += head + p + r + tail
        labels += [packed.IGNORE_INDEX] * (len(head) + len(p)) + r + tail
        lengths.append(len(head) + len(p) + len(r) + len(tail))
    return Stream(np.asarray(ids, np.int32), np.asarray(labels, np.int32), np.asarray(lengths, np.int64))


def repeats_needed(base_tokens: int, rows_needed: int, context_length: int, requested: int) -> int:
    return max(requested, math.ceil(rows_needed * context_length / base_tokens))


def _write_repeated(path: Path, flat: np.ndarray, shape: tuple[int, int]) -> None:
    """Write an .npy file holding `flat` repeated and cut to `shape`, copy by copy, sequentially:
    no output-sized array is ever built, and sequential writes beat a memory-mapped fill."""
    total = shape[0] * shape[1]
    with path.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<i4", "fortran_order": False, "shape": shape})
        for lo in range(0, total, flat.size):
            flat[: min(flat.size, total - lo)].tofile(fh)


def pack_stream(stream: Stream, context_length: int, repeat: int, out_dir: Path) -> dict:
    """Write `repeat` copies of the stream, cut into full rows, into `out_dir`. Returns counts."""
    base = stream.input_ids.size
    rows = repeat * base // context_length
    total = rows * context_length
    _write_repeated(out_dir / packed.INPUT_IDS, stream.input_ids.astype("<i4", copy=False), (rows, context_length))
    _write_repeated(out_dir / packed.LABELS, stream.labels.astype("<i4", copy=False), (rows, context_length))
    copies, rest = divmod(total, base)
    trained = stream.labels != packed.IGNORE_INDEX
    label_tokens = copies * int(np.count_nonzero(trained)) + int(np.count_nonzero(trained[:rest]))
    starts_one = np.concatenate([[0], np.cumsum(stream.doc_lengths)[:-1]])
    offsets = np.arange(copies + (rest > 0), dtype=np.int64)[:, None] * base
    starts = (offsets + starts_one[None, :]).reshape(-1)
    starts = starts[starts < total]
    np.save(out_dir / packed.DOC_STARTS, starts)
    return {"rows": rows, "tokens": total, "documents": int(starts.size), "label_tokens": label_tokens,
            "dropped_tail_tokens": repeat * base - total}


def cache_root() -> Path:
    return fbench_home() / "data"


def _inputs(scenario: Scenario, progress: bool = True):
    """The tokenizer, the sources with their records, and the cache key: everything the packed
    output depends on, and the vocabulary its ids were checked against."""
    ds = scenario.dataset
    tok = tokenizers_.load(ds.tokenizer)
    srcs = catalog.sources(ds, progress)
    sources = [alpaca.load_source(s) for s in srcs]
    key_inputs = {
        "format": FORMAT_VERSION,
        "template": alpaca.TEMPLATE_NAME,
        "sources": [fp for _, fp in sources],
        "tokenizer": tokenizers_.fingerprint(tok),
        "vocab_size": scenario.arch.vocab_size,
        "context_length": scenario.context_length,
        "rows_needed": scenario.rows_needed,
        "repeat": ds.repeat,
    }
    key = hashlib.sha256(json.dumps(key_inputs, sort_keys=True).encode()).hexdigest()[:20]
    return tok, list(zip(srcs, sources)), key_inputs, key


def packed_dir(scenario: Scenario) -> Path:
    """Where `pack(scenario)` puts (or finds) its output, without packing anything."""
    return cache_root() / _inputs(scenario, progress=False)[3]


def pack(scenario: Scenario, progress: bool = True, say=print) -> PackedData:
    """Build (or reuse) the packed data of `scenario`; identical inputs give the same folder and sha256.
    A cached folder is reused only when every file it lists has its recorded size and sha256
    (hashing takes seconds per GB, small beside any run); a damaged one is packed again."""
    ds = scenario.dataset
    tok, sources, key_inputs, key = _inputs(scenario, progress)
    records = [r for _, (recs, _) in sources for r in recs]
    out = cache_root() / key
    _sweep_abandoned(cache_root())
    if out.exists():
        manifest, problem = verified_manifest(out)
        if problem is None:
            return PackedData(out, manifest, cached=True)
        say(f"cached packed data {out} is damaged ({problem}): packing it again")
        _remove(out)

    started = time.monotonic()
    with Progress(disable=not progress, transient=True) as bar:
        stream = tokenize(tok, records, bar if progress else None)
    vocab = scenario.arch.vocab_size
    if stream.input_ids.size and int(stream.input_ids.max()) >= vocab:
        raise alpaca.DataError(
            f"tokenizer produces id {int(stream.input_ids.max())} >= the model's vocab_size {vocab}"
        )
    repeat = repeats_needed(stream.input_ids.size, scenario.rows_needed, scenario.context_length, ds.repeat)
    _check_free_space(out.parent, stream, repeat, scenario.context_length)
    if repeat > ds.repeat:
        say(f"dataset holds {stream.input_ids.size:,} tokens: repeated {repeat}x to fill "
            f"{scenario.rows_needed} rows of {scenario.context_length:,}")
    tmp = out.with_name(f"{out.name}.tmp-{_owner()}-{time.monotonic_ns()}")
    tmp.mkdir(parents=True)
    try:
        counts = pack_stream(stream, scenario.context_length, repeat, tmp)
        tokenizers_.save_for_transformers(tok, tmp / packed.TOKENIZER_DIR, scenario.context_length)
        arrays = [np.load(tmp / name, mmap_mode="r") for name in (packed.INPUT_IDS, packed.LABELS, packed.DOC_STARTS)]
        manifest = {
            "format": FORMAT_VERSION,
            "context_length": scenario.context_length,
            **counts,
            "sha256": packed.stream_sha256(*arrays),
            "base_documents": len(records),
            "base_tokens": int(stream.input_ids.size),
            "repeat": repeat,
            "repeat_requested": ds.repeat,
            "template": alpaca.TEMPLATE_NAME,
            "dataset": ds.name,
            "tokenizer": {**ds.tokenizer.model_dump(), "vocab_size": tok.get_vocab_size(),
                          "sha256": key_inputs["tokenizer"]},
            "model_vocab_size": vocab,
            "sources": [{**s.model_dump(exclude_none=True, exclude_defaults=True), "records": len(recs),
                         "fingerprint": fp} for s, (recs, fp) in sources],
            "cache_key": key,
            "files": _describe_files(tmp),
            "seconds": round(time.monotonic() - started, 3),
        }
        del arrays
        (tmp / packed.MANIFEST).write_text(json.dumps(manifest, indent=2))
        try:
            tmp.rename(out)  # atomic: a crash never leaves a half-written cache entry
        except OSError:  # another process finished the same entry first
            shutil.rmtree(tmp)
    except BaseException:  # Ctrl-C, and SIGTERM/SIGHUP (the CLI raises them as KeyboardInterrupt)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return PackedData(out, json.loads((out / packed.MANIFEST).read_text()))


def _describe_files(directory: Path) -> dict[str, dict]:
    """Every file but the manifest: its size and sha256, checked when the folder is reused."""
    return {p.relative_to(directory).as_posix(): {"bytes": p.stat().st_size, "sha256": packed.file_sha256(p)}
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != packed.MANIFEST}


def verified_manifest(directory: Path) -> tuple[dict | None, str | None]:
    """(manifest, None) when every listed file has its recorded size, then its sha256;
    (None, what is wrong) otherwise. Sizes first: a truncated file costs no hashing."""
    try:
        manifest = json.loads((directory / packed.MANIFEST).read_text())
        files = {name: (int(f["bytes"]), str(f["sha256"])) for name, f in manifest["files"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"no readable manifest: {type(e).__name__}: {e}"
    for name, (size, _) in files.items():
        path = directory / name
        if not path.is_file():
            return None, f"{name} is missing"
        if path.stat().st_size != size:
            return None, f"{name} has {path.stat().st_size:,} bytes, not {size:,}"
    for name, (_, digest) in files.items():
        if packed.file_sha256(directory / name) != digest:
            return None, f"{name} does not match its sha256"
    return manifest, None


def _check_free_space(folder: Path, stream: Stream, repeat: int, context_length: int) -> None:
    """Refuse before writing anything when the packed files would not fit on the disk."""
    tokens = repeat * stream.input_ids.size
    need = 2 * 4 * tokens + 8 * repeat * stream.doc_lengths.size  # ids + labels (int32), starts (int64)
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if need + FREE_SPACE_MARGIN > free:
        raise alpaca.DataError(
            f"packing {tokens:,} tokens (rows of {context_length:,}, dataset repeated {repeat}x) needs "
            f"{need / 2**30:,.1f} GiB in {folder}, plus {FREE_SPACE_MARGIN / 2**30:,.0f} GiB kept free, and it has "
            f"{free / 2**30:,.1f} GiB free: free some space or set FBENCH_HOME to a larger disk")


def _owner() -> str:
    """Names a temporary folder after its writer (host and pid), so a later pack can tell
    the leftovers of a killed writer from another live writer's work."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _sweep_abandoned(root: Path) -> None:
    """Remove temporary and damaged folders left by packers of this host that no longer run
    (killed with SIGKILL, or the machine went down)."""
    host = socket.gethostname()
    for d in root.glob("*.tmp-*"):
        _, _, owner = d.name.partition(".tmp-")
        owner_host, _, rest = owner.rpartition("-")  # rest: the monotonic ns
        h, _, pid = owner_host.rpartition("-")
        if h == host and pid.isascii() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(directory: Path) -> None:
    """Move a damaged folder aside, then delete it: readers that hold it open keep their files."""
    aside = directory.with_name(f"{directory.name}.tmp-{_owner()}-{time.monotonic_ns()}")
    try:
        directory.rename(aside)
    except FileNotFoundError:  # another process removed it first
        return
    shutil.rmtree(aside, ignore_errors=True)
