#!/usr/bin/env python
"""Packing benchmark (not a test): fbench's `pack_stream` against XTuner's own `Packer`.

Alpaca (the shared en + zh demo files) is tokenized once with fbench's built-in byte
tokenizer, repeated to at least --tokens tokens and packed into rows of --row tokens:

  fbench   `framework_bench.data.packing.pack_stream`: vectorised numpy, written into
           memory-mapped .npy files in a temporary folder (disk writes included).
  xtuner   `xtuner.dataset.utils.Packer(row, use_varlen_attn=False)` called exactly as
           `datasets.map(batched=True, batch_size=25000, num_proc=1)` calls it in the
           published run: one dict of per-document `input_ids`/`labels` lists per batch of
           25000 documents, state carried between batches. Only the Packer calls are timed
           (building the Python lists, which datasets does from Arrow, is not).
  --datasets-map additionally times the whole published step, `Dataset.map(Packer, ...)`.

Both are fed the same documents in the same order; the script checks that they produce
the same full rows (sha256 over input_ids, and the labels) and prints times, peak RSS and
the speed ratio.

Each side runs in its own process (so peak RSS is its own), with the Python that can
import it: fbench's packer needs the host's dependencies (pydantic, rich, tokenizers),
which XTuner's env lacks, and XTuner lives only in its env. Run it with either:

    .venv/bin/python benchmarks/pack_benchmark.py
    .fbench/envs/xtuner/bin/python benchmarks/pack_benchmark.py

The other Python is found at <repo>/.venv/bin/python and $FBENCH_HOME/envs/xtuner/bin/python
(default FBENCH_HOME: <repo>/.fbench), or given with --host-python / --xtuner-python.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ALPACA = Path(os.environ.get("FBENCH_DATA") or ROOT.parent / "shared" / "data" / "alpaca")  # the demo files
SOURCES = [ALPACA / "alpaca_en_demo.json", ALPACA / "alpaca_zh_demo.json"]
STREAM = "stream.npz"
IGNORE_INDEX = -100


def parse_length(text: str) -> int:
    m = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: use an integer or 8k / 1M")
    return int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 * 1024}[m.group(2).lower()]


def rss_now_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def rss_peak_mib() -> float:
    """Peak RSS of this process image. VmHWM, not getrusage's ru_maxrss: Linux carries
    ru_maxrss across exec, so a stage would inherit the peak of the process that forked it."""
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_stream(work: Path):
    z = np.load(work / STREAM)
    return z["input_ids"], z["labels"], z["doc_lengths"]


def repeat_for(base_tokens: int, target: int) -> int:
    return math.ceil(target / base_tokens)


# --- stages, each run in its own process ------------------------------------------------


def stage_tokenize(args) -> dict:
    from framework_bench.data import alpaca, packing, tokenizer
    from framework_bench.scenario.scenario import DataSource

    records = [r for p in SOURCES for r in alpaca.load_source(DataSource(path=str(p)))[0]]
    t = time.perf_counter()
    stream = packing.tokenize(tokenizer.builtin_bytes(), records)
    seconds = time.perf_counter() - t
    np.savez(args.work / STREAM, input_ids=stream.input_ids, labels=stream.labels, doc_lengths=stream.doc_lengths)
    return {"documents": len(records), "tokens": int(stream.input_ids.size), "seconds": seconds}


def stage_fbench(args) -> dict:
    from framework_bench.worker import packed
    from framework_bench.data import packing

    ids, labels, lengths = load_stream(args.work)
    stream = packing.Stream(ids, labels, lengths)
    repeat = repeat_for(ids.size, args.tokens)
    rss_before = rss_now_mib()
    times = []
    for attempt in range(args.repeats):  # best of N: this machine may be shared
        out = args.work / f"fbench{attempt}"
        out.mkdir()
        t = time.perf_counter()
        counts = packing.pack_stream(stream, args.row, repeat, out)
        times.append(time.perf_counter() - t)
    seconds = min(times)
    peak = rss_peak_mib()
    rows = np.load(out / packed.INPUT_IDS, mmap_mode="r")
    lab = np.load(out / packed.LABELS, mmap_mode="r")
    return {"seconds": seconds, "times": times, "rows": counts["rows"], "tokens": counts["tokens"], "repeat": repeat,
            "documents": counts["documents"], "rss_before_mib": rss_before, "rss_peak_mib": peak,
            "output_mib": (rows.nbytes + lab.nbytes) / 2**20,
            "sha256_ids": packed.sha256_of(rows), "sha256_labels": packed.sha256_of(lab)}


def _documents(args):
    """Per-document Python lists, repeated as XTuner's `concatenate_datasets([ds] * n)` does."""
    ids, labels, lengths = load_stream(args.work)
    cuts = np.cumsum(lengths)[:-1]
    doc_ids = [a.tolist() for a in np.split(ids, cuts)]
    doc_labels = [a.tolist() for a in np.split(labels, cuts)]
    repeat = repeat_for(ids.size, args.tokens)
    return doc_ids * repeat, doc_labels * repeat, repeat


def _summarise_rows(rows_ids, rows_labels, row: int) -> dict:
    from framework_bench.worker.packed import sha256_of  # stdlib + numpy: importable in the xtuner env

    full = [i for i, r in enumerate(rows_ids) if len(r) == row]
    short = len(rows_ids) - len(full)
    ids = np.asarray([rows_ids[i] for i in full], dtype=np.int32).reshape(len(full), row)
    lab = np.asarray([rows_labels[i] for i in full], dtype=np.int32).reshape(len(full), row)
    return {"rows": len(full), "short_rows": short, "sha256_ids": sha256_of(ids), "sha256_labels": sha256_of(lab)}


def stage_xtuner(args) -> dict:
    from xtuner.dataset.utils import Packer  # imports torch/transformers: before any timing

    import xtuner

    doc_ids, doc_labels, repeat = _documents(args)
    rss_before = rss_now_mib()
    times = []
    for _ in range(args.repeats):  # best of N, a fresh Packer each time
        packer = Packer(args.row, use_varlen_attn=False)
        rows_ids, rows_labels = [], []
        t = time.perf_counter()
        for lo in range(0, len(doc_ids), args.batch_size):
            out = packer({"input_ids": doc_ids[lo: lo + args.batch_size],
                          "labels": doc_labels[lo: lo + args.batch_size]})
            rows_ids += out["input_ids"]
            rows_labels += out["labels"]
        times.append(time.perf_counter() - t)
        del out
    seconds = min(times)
    peak = rss_peak_mib()
    return {"seconds": seconds, "times": times, "repeat": repeat, "documents": len(doc_ids), "version": xtuner.__version__,
            "rss_before_mib": rss_before, "rss_peak_mib": peak, **_summarise_rows(rows_ids, rows_labels, args.row)}


def stage_datasets_map(args) -> dict:
    """The published step itself: `Dataset.map(Packer(...), batched=True, batch_size=25000, num_proc=1)`."""
    import datasets
    from xtuner.dataset.utils import Packer

    doc_ids, doc_labels, repeat = _documents(args)
    ds = datasets.Dataset.from_dict({"input_ids": doc_ids, "labels": doc_labels})
    del doc_ids, doc_labels
    datasets.disable_progress_bars()
    rss_before = rss_now_mib()
    t = time.perf_counter()
    packed_ds = ds.map(Packer(args.row, use_varlen_attn=False), batched=True, batch_size=args.batch_size,
                       num_proc=1, remove_columns=ds.column_names, load_from_cache_file=False,
                       cache_file_name=str(args.work / "xtuner_map.arrow"))
    seconds = time.perf_counter() - t
    peak = rss_peak_mib()
    return {"seconds": seconds, "rss_before_mib": rss_before, "rss_peak_mib": peak, "datasets": datasets.__version__,
            **_summarise_rows(packed_ds["input_ids"], packed_ds["labels"], args.row)}


STAGES = {"tokenize": stage_tokenize, "fbench": stage_fbench, "xtuner": stage_xtuner,
          "datasets_map": stage_datasets_map}


# --- orchestration -----------------------------------------------------------------------


def _can_import(python: str, module: str) -> bool:
    # Always in a child: importing xtuner here would load torch into this process.
    if not Path(python).exists():
        return False
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0


def _pick(given: str | None, candidates: list[Path], module: str) -> str | None:
    for python in ([given] if given else [sys.executable, *map(str, candidates)]):
        if _can_import(python, module):
            return python
    return None


def _run_stage(python: str, stage: str, args) -> dict:
    argv = [python, __file__, "--stage", stage, "--work", str(args.work), "--tokens", str(args.tokens),
            "--row", str(args.row), "--batch-size", str(args.batch_size), "--repeats", str(args.repeats)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stderr[-4000:])
        raise SystemExit(f"stage {stage} failed with {python} (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=parse_length, default=10_000_000, help="at least this many tokens (default 10M)")
    ap.add_argument("--row", type=parse_length, default=parse_length("1M"), help="row length (default 1M)")
    ap.add_argument("--batch-size", type=int, default=25000, help="documents per Packer call (published: 25000)")
    ap.add_argument("--repeats", type=int, default=3, help="time each packer this many times, report the best")
    ap.add_argument("--datasets-map", action="store_true", help="also time XTuner's step through datasets.map")
    ap.add_argument("--host-python", help="a Python that imports framework_bench.data.packing")
    ap.add_argument("--xtuner-python", help="a Python that imports xtuner")
    ap.add_argument("--stage", choices=sorted(STAGES), help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.stage:
        print(json.dumps(STAGES[args.stage](args)))
        return

    home = Path(os.environ.get("FBENCH_HOME", ROOT / ".fbench"))
    host = _pick(args.host_python, [ROOT / ".venv/bin/python"], "framework_bench.data.packing")
    if host is None:
        raise SystemExit("no Python here imports framework_bench.data.packing: give --host-python")
    xt = _pick(args.xtuner_python, [home / "envs/xtuner/bin/python"], "xtuner.dataset.utils")

    with tempfile.TemporaryDirectory(prefix="fbench-packbench-") as tmp:
        args.work = Path(tmp)
        tok = _run_stage(host, "tokenize", args)
        repeat = repeat_for(tok["tokens"], args.tokens)
        print(f"Alpaca: {tok['documents']:,} documents, {tok['tokens']:,} byte-tokenizer tokens "
              f"(tokenized in {tok['seconds']:.2f} s); repeated {repeat}x = {repeat * tok['tokens']:,} tokens; "
              f"rows of {args.row:,}")
        fb = _run_stage(host, "fbench", args)
        print(f"fbench pack_stream   {fb['seconds']:8.3f} s  (best of {' '.join(f'{t:.3f}' for t in fb['times'])}) {fb['rows']} rows, {fb['tokens']:,} tokens, "
              f"{fb['documents']:,} documents; peak RSS {fb['rss_peak_mib']:.0f} MiB "
              f"(before packing {fb['rss_before_mib']:.0f} MiB; output {fb['output_mib']:.0f} MiB, memory-mapped)"
              f"  [{host}]")
        if xt is None:
            print("xtuner: not importable here nor in $FBENCH_HOME/envs/xtuner: no comparison "
                  "(create it with `fbench env create xtuner`, or give --xtuner-python)")
            return
        x = _run_stage(xt, "xtuner", args)
        print(f"xtuner Packer        {x['seconds']:8.3f} s  (best of {' '.join(f'{t:.3f}' for t in x['times'])}) {x['rows']} full rows (+{x['short_rows']} short), "
              f"batches of {args.batch_size:,} documents; peak RSS {x['rss_peak_mib']:.0f} MiB "
              f"(before packing {x['rss_before_mib']:.0f} MiB, the per-document lists)  [xtuner {x['version']}, {xt}]")
        same_ids = x["sha256_ids"] == fb["sha256_ids"] and x["rows"] == fb["rows"]
        same_labels = x["sha256_labels"] == fb["sha256_labels"]
        print(f"same rows: input_ids {'yes' if same_ids else 'NO'}, labels {'yes' if same_labels else 'NO'} "
              f"(sha256 {fb['sha256_ids'][:16]}... over {fb['rows']} rows)")
        print(f"speed ratio (xtuner Packer / fbench): {x['seconds'] / fb['seconds']:.1f}x")
        if args.datasets_map:
            d = _run_stage(xt, "datasets_map", args)
            same = d["sha256_ids"] == fb["sha256_ids"] and d["sha256_labels"] == fb["sha256_labels"]
            print(f"xtuner datasets.map  {d['seconds']:8.3f} s  {d['rows']} full rows (+{d['short_rows']} short); "
                  f"peak RSS {d['rss_peak_mib']:.0f} MiB (before {d['rss_before_mib']:.0f} MiB); same rows: "
                  f"{'yes' if same else 'NO'}; ratio {d['seconds'] / fb['seconds']:.1f}x  [datasets {d['datasets']}]")
        if not (same_ids and same_labels):
            raise SystemExit("the two packers disagree")


if __name__ == "__main__":
    main()
