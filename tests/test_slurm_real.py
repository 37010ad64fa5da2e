"""SLURM on a real Slurm: a one-node cluster of this machine (tests/slurm_cluster.py), which shows
what the stand-ins of test_slurm.py cannot: sbatch's environment, srun's task under slurmstepd
(the host's clock watcher, the workers its descendants), the queue and each job's ending. A compare
of two frameworks, two rounds of one job each, collected with --wait: every row ok."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fbench_fixtures import backend_env_or_skip
from framework_bench.cli import app
from slurm_cluster import real_slurm, slurm_cluster  # noqa: F401 - the fixtures

FRAMEWORKS, REFERENCE = ("llamafactory", "xtuner"), "torch"


def _rows(db: Path) -> list[dict]:
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM runs ORDER BY id")]


def _checks(run_dir: Path) -> dict[str, str]:
    return {c["name"]: c["status"] for c in json.loads((run_dir / "result.json").read_text())["checks"]}


@pytest.mark.slow  # two real trainers and the reference, twice
def test_a_compare_of_two_frameworks_on_a_real_slurm_ends_ok(real_slurm, home_with_envs, tmp_path):
    """Each round one job (the frameworks, the reference last, then the reference trained as
    LLaMA-Factory normalises its loss); every row ok: parity and update parity with the round's
    reference, and the workers' CPU time read on the node by the watcher that started them."""
    for name in (*FRAMEWORKS, REFERENCE):
        backend_env_or_skip(name)
    db = tmp_path / "results.sqlite"
    started = time.monotonic()
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", ",".join(FRAMEWORKS),
                                   "--launcher", "slurm", "--repeat", "2", "--wait", "--poll", "1", "--db", str(db),
                                   "--out", str(tmp_path / "plots")])
    print(f"\ncompare on a one-node Slurm, 2 rounds of {', '.join(FRAMEWORKS)}: {time.monotonic() - started:.0f} s")
    assert res.exit_code == 0 and res.exception is None, res.output
    jobs = re.findall(r"submitted: SLURM job (\d+)", res.stdout)
    assert len(jobs) == 6 and len(set(jobs)) == 2, res.stdout  # one job a round, three runs in each
    rows = _rows(db)
    assert sorted((r["trial_round"], r["backend"]) for r in rows) == [
        (i, b) for i in (1, 2) for b in sorted((*FRAMEWORKS, REFERENCE))]
    for row in rows:
        run_dir = Path(row["run_dir"])
        checks, sub = _checks(run_dir), json.loads((run_dir / "slurm.json").read_text())
        assert row["status"] == "ok", (row["backend"], row["reason"])
        assert checks["cpu"] == checks["warmup"] == "pass", (row["backend"], checks)
        assert json.loads((run_dir / "host_clock.json").read_text())["cpu_read"]
        assert row["steps_measured"] == 5 and row["tokens_measured"] == 5 * 512 and row["tgs"] > 0
        assert sub["result_id"] == row["id"] and (run_dir / f"slurm-{sub['job_id']}.out").exists()
        if row["backend"] != REFERENCE:
            assert checks["parity"] == checks["update_parity"] == "pass", (row["backend"], checks)
    for row in (r for r in rows if r["backend"] == "llamafactory"):  # judged at every step: HF Trainer's loss
        judging = Path(json.loads((Path(row["run_dir"]) / "slurm.json").read_text())["judging"]["step_label_mean"])
        assert (judging / "slurm-exit-code").read_text().strip() == "0" and str(judging) in row["notes"]
