"""The consumed-rows record: which packed rows a rank really fed to its trainer, step by step.

A worker calls `ConsumedRows.add(input_ids, labels)` on every micro-batch its trainer
receives (whole rows, before any sequence-parallel split: each rank of an SP group
records the same rows) and `end_step(step)` after each optimizer step. One line per
optimizer step goes to `RUN_DIR/consumed_rows/rank<R>.jsonl`:
{"step": k, "rows": [fingerprint, ...]}, a fingerprint being the first 16 hex digits of
the sha256 of the row's input ids and labels (little-endian int32), as `row_fingerprint`.

The host (`framework_bench/measure/verify.py`) recomputes the fingerprints of the rows each step
must consume from its own packed stream and compares. Stdlib + numpy at import; tensors
are moved to the CPU only here, once per micro-batch, outside the timed window when the
caller pauses its step timer around it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

CONSUMED_DIR = "consumed_rows"


def row_fingerprint(input_ids, labels) -> str:
    """Identity of one packed row: its token ids and its labels."""
    h = hashlib.sha256(np.ascontiguousarray(input_ids, dtype="<i4").tobytes())
    h.update(np.ascontiguousarray(labels, dtype="<i4").tobytes())
    return h.hexdigest()[:16]


def _numpy(a) -> np.ndarray:
    if hasattr(a, "detach"):  # a torch tensor
        a = a.detach().cpu().numpy()
    return np.asarray(a)


class ConsumedRows:
    """Collects the fingerprints of the rows fed in the current optimizer step (one per rank)."""

    def __init__(self, run_dir: str | Path, rank: int):
        directory = Path(run_dir) / CONSUMED_DIR
        directory.mkdir(parents=True, exist_ok=True)
        self._fh = (directory / f"rank{rank}.jsonl").open("a", buffering=1)
        self._rows: list[str] = []

    def add(self, input_ids, labels) -> None:
        """A micro-batch of whole rows, [batch, context] (or one row, [context])."""
        ids, lab = _numpy(input_ids), _numpy(labels)
        ids, lab = ids.reshape(-1, ids.shape[-1]), lab.reshape(-1, lab.shape[-1])
        self._rows += [row_fingerprint(i, l) for i, l in zip(ids, lab)]

    def end_step(self, step: int) -> None:
        self._fh.write(json.dumps({"step": step, "rows": self._rows}) + "\n")
        self._rows = []

    def close(self) -> None:
        self._fh.close()


def read_consumed(run_dir: str | Path) -> dict[int, dict[int, list[str]]] | None:
    """{rank: {step: fingerprints}} as the workers wrote them; None when none were written
    (a plugin that does not record its rows)."""
    directory = Path(run_dir) / CONSUMED_DIR
    files = sorted(directory.glob("rank*.jsonl")) if directory.is_dir() else []
    if not files:
        return None
    out: dict[int, dict[int, list[str]]] = {}
    for path in files:
        steps = out.setdefault(int(path.stem.removeprefix("rank")), {})
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                steps[int(rec["step"])] = list(rec["rows"])
    return out
