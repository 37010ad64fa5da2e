"""The host's packed rows as the HF dataset the generated config loads (`load_from_disk`), in
the xtuner env: written by one process of the run, checked against the stream the host hashed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from framework_bench.worker import Job, publish_once
from framework_bench.worker.packed import stream_sha256

DATA_SHA256 = "fbench-data-sha256"  # in the converted dataset's folder: the stream sha256 of what XTuner loads


def convert_rows(job: Job, out_dir: Path) -> None:
    """The packed rows as a HF dataset (`input_ids`, `labels`; -100 = no loss) for `load_from_disk`,
    written by one process of the run (the others wait for it).

    The writer checks the rows are the stream the host hashed, and the stream sha256 of the
    token ids and labels read back from the written dataset, i.e. of what XTuner will load;
    every process then checks the sha256 the writer recorded.
    """
    publish_once(out_dir, lambda tmp: _write_dataset(job, tmp))
    job.check_data((out_dir / DATA_SHA256).read_text(), f"converted dataset {out_dir}")


def _write_dataset(job: Job, tmp: Path) -> None:
    import datasets
    import pyarrow as pa

    packed = job.open_rows()
    ctx = packed.context_length

    def fixed_rows(a: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(a).reshape(-1)), ctx)

    columns = {"input_ids": fixed_rows(packed.input_ids), "labels": fixed_rows(packed.labels)}
    if job.scenario.attention == "varlen":
        # What XTuner's own packer adds for varlen attention: document boundaries and
        # positions restarting at each document.
        cu = [packed.cu_seqlens(r) for r in range(packed.rows)]
        positions = [np.concatenate([np.arange(b - a) for a, b in zip(c[:-1], c[1:])]) for c in cu]
        columns["cumulative_len"] = pa.array([c.tolist() for c in cu])
        columns["position_ids"] = fixed_rows(np.stack(positions))
    datasets.Dataset(pa.table(columns)).save_to_disk(str(tmp))

    # Read back as Arrow, not through datasets' numpy formatter: with deepspeed installed
    # torchvision is imported, and that formatter then asks torchvision 0.28 for VideoReader,
    # which it no longer has (ImportError).
    table = datasets.load_from_disk(str(tmp)).data
    ids, labels = (table.column(c).combine_chunks().flatten().to_numpy().reshape(-1, ctx) for c in ("input_ids", "labels"))
    sha = stream_sha256(ids, labels, packed.doc_starts)
    job.check_data(sha, f"converted dataset {tmp}")
    (tmp / DATA_SHA256).write_text(sha)
