"""The referee (framework_bench/run/referee.py): one judging function, called by the round
(framework_bench/run/round.py) that `fbench compare`, `run`, `check-backend`, `device check` and
`results collect` all drive, so one backend's run is judged by the same
checks whichever command ran it; and what it refuses to judge with."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench import testing
from framework_bench.device import check as device_check
from framework_bench.cli import app
from framework_bench.measure.metrics import RunResult
from framework_bench.run import compare, referee
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario

STANDINS = Path(__file__).parent / "slurm_standins"
CANDIDATE = "fake_noisy"  # honest: its losses and update agree with fake_ok's, the fakes' reference


def _judged_checks(result: RunResult | dict) -> list[str]:
    checks = result.checks if isinstance(result, RunResult) else result["checks"]
    return sorted(c.name if hasattr(c, "name") else c["name"] for c in checks)


@pytest.mark.slow  # starts a framework's or the host's own process
def test_compare_run_check_backend_and_collect_judge_with_the_same_checks(fakes, home_with_envs, tmp_path,
                                                                         monkeypatch):
    tiny = scenario.load("tiny_cpu")
    by_command = {}
    [judged] = [r for r in compare.compare([tiny], [CANDIDATE], RunOptions(root=tmp_path / "compare"))
                if r.backend == CANDIDATE]
    by_command["compare"] = judged
    db = tmp_path / "run.sqlite"
    res = CliRunner().invoke(app, ["run", "--backend", CANDIDATE, "--scenario", "tiny_cpu", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    by_command["run"] = json.loads(res.stdout)
    by_command["check-backend"] = testing.check_backend(CANDIDATE, tmp_path / "check").result
    device_rows = device_check.check(tmp_path / "device", budget_s=600, device="cpu", backends=("fake_ok", CANDIDATE))
    [by_command["device check"]] = [r for r in device_rows if r.backend == CANDIDATE]
    monkeypatch.setenv("FAKE_SLURM_DIR", str(tmp_path / "slurm-state"))
    monkeypatch.setenv("PATH", f"{STANDINS}:{os.environ['PATH']}")
    slurm_db = tmp_path / "slurm.sqlite"
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", f"{CANDIDATE},fake_ok", "--launcher", "slurm",
                                   "--db", str(slurm_db), "--wait", "--poll", "0.5"])
    assert res.exit_code == 0, res.output
    [row] = [r for r in json.loads(CliRunner().invoke(app, ["results", "export", "--db", str(slurm_db),
                                                            "--format", "json"]).stdout)
             if r["backend"] == CANDIDATE]
    by_command["collect"] = json.loads((Path(row["run_dir"]) / "result.json").read_text())
    names = {command: _judged_checks(r) for command, r in by_command.items()}
    assert {"parity", "update_parity", "projection_delay"} <= set(names["compare"]), (names["compare"], by_command["compare"].reason)
    assert all(n == names["compare"] for n in names.values()), {c: (sorted(set(n) ^ set(names['compare'])), by_command[c]) for c, n in names.items() if n != names['compare']}


def _run(backend: str, status: str = "ok", losses: dict[int, float] | None = None) -> RunResult:
    return RunResult(backend=backend, scenario="tiny_cpu", status=status, loss_curve=losses or {1: 2.0, 2: 1.9})


@pytest.mark.parametrize("reference, why", [
    (None, "no reference run (none was run)"),
    (_run("ref", "failed"), "the reference ref ended failed"),
    (_run("ref", losses={1: 2.0, 2: math.nan}), "the reference ref's losses are not all finite"),
])
def test_a_run_is_never_ok_without_a_reference_fit_to_judge(reference, why):
    judged = referee.judge(_run("a"), reference, scenario.load("tiny_cpu"))
    assert judged.status == "unverified" and why in judged.reason


def test_a_run_that_already_failed_is_not_judged_and_its_reason_is_shortened():
    long = _run("a", "failed")
    long.reason = "\n".join(f"line {i}" for i in range(500))
    judged = referee.judge(long, _run("ref"), scenario.load("tiny_cpu"))
    assert judged.status == "failed" and not judged.checks
    assert len(judged.reason.splitlines()) <= referee.REASON_LINES + 1 and "lines left out" in judged.reason
