"""The host verifies what a worker claims: each lie of a throwaway backend ends `invalid`,
never `ok`, and an honest one passes every check (framework_bench/measure/verify.py).

The liars are registered through the `fbench.backends` entry points like any third-party
backend (tests/fake_backends); each writes real metrics, rows and report files.
"""

from pathlib import Path

import pytest

from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.measure import verify
from framework_bench.plugins.contract import StepMetric, WorkerReport
from framework_bench.scenario.models import PRESETS, parameter_count
from framework_bench.store.results import ResultStore



def _run(backend: str, tmp_path: Path):
    scn = scenario.load("tiny_cpu")
    result = pipeline.run_one(backend, scn, RunOptions(root=tmp_path / "runs"))
    return result, {c.name: c for c in result.checks}


def test_an_honest_backend_passes_every_check(fakes, tmp_path):
    result, checks = _run("fake_ok", tmp_path)
    assert result.status == "ok", result.reason
    assert {n: c.status for n, c in checks.items()} == {n: "pass" for n in
                                                         ("tokens", "steps", "rows", "throughput", "parameters", "settings",
                                                          "clock", "pauses", "gaps", "warmup_time", "warmup", "cpu",
                                                          "initial_weights", "update", "losses_in_time", "initial_reveal",
                                                          "warmup_update", "median_step")}
    assert result.settings["trainer"] == "fake-loop-ok" and not result.flags
    with ResultStore(tmp_path / "r.sqlite") as store:
        row = store.get(store.add(result, scenario.load("tiny_cpu")))
    assert row["status"] == "ok" and [c["status"] for c in row["checks"]] == ["pass"] * 18
    assert row["settings"]["zero_stage"] == 0 and row["settings_mode"] == "matched"


@pytest.mark.parametrize("liar, check, says", [
    ("fake_echo_sha", "rows", "a row not in the stream"),
    ("fake_double_tokens", "tokens", "reports 1024 tokens, the scenario makes 512"),
    ("fake_missing_steps", "steps", "rank 0: missing [3]"),
    ("fake_wrong_rows", "rows", "step 1 fed 1 row(s) (row 1), not stream rows 0..0"),
    ("fake_wrong_model", "parameters", "parameters, the scenario's config"),
])
def test_each_lie_ends_invalid(fakes, tmp_path, liar, check, says):
    result, checks = _run(liar, tmp_path)
    assert result.status == "invalid"
    assert checks[check].status == "fail" and says in checks[check].detail
    assert says in result.reason
    with ResultStore(tmp_path / "r.sqlite") as store:
        row = store.get(store.add(result, scenario.load("tiny_cpu")))
    assert row["status"] == "invalid" and says in row["reason"]


def test_a_plugin_that_reports_no_claims_is_unverified_not_invalid():
    scn = scenario.load("tiny_cpu")
    steps = [StepMetric(step=s, seconds=0.5, tokens=512) for s in range(1, 8)]
    checks = verify.verify(scn, WorkerReport(steps=steps), Path("/nonexistent"), host_tgs=1024.0)
    status = {c.name: c.status for c in checks}
    assert status == {"tokens": "pass", "steps": "pass", "rows": "unverified", "throughput": "unverified",
                      "parameters": "unverified", "settings": "unverified"}
    reason, flags = verify.fold(checks)
    assert reason is None and len(flags) == 4 and all("unverified: " in f for f in flags)


def test_throughput_disagreement_is_flagged_not_invalid():
    scn = scenario.load("tiny_cpu")
    steps = [StepMetric(step=s, seconds=0.5, tokens=512) for s in range(1, 8)]
    report = WorkerReport(steps=steps, framework_throughput={"tokens_per_sec": 2048.0})
    check = verify.check_throughput(scn, report, host_tgs=1024.0)
    assert check.status == "fail" and "+100.0%" in check.detail
    reason, flags = verify.fold([check])
    assert reason is None and flags == [f"throughput: {check.detail}"]
    whole = WorkerReport(steps=steps, framework_throughput={"tokens_per_sec_whole_run": 1000.0})
    assert verify.check_throughput(scn, whole, host_tgs=None).status == "pass"


def test_expected_parameter_count_of_the_published_models():
    # The published sizes: Llama-2-7B 6,738,415,616; Llama-2-70B 68,976,648,192; Yi-34B 34,388,917,248.
    assert parameter_count(PRESETS["llama2-7b"]) == 6_738_415_616
    assert parameter_count(PRESETS["llama2-70b"]) == 68_976_648_192
    assert parameter_count(PRESETS["yi-34b-200k"]) == 34_388_917_248


@pytest.mark.slow  # starts a framework's or the host's own process
def test_check_backend_passes_an_honest_backend_and_fails_a_liar(fakes, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from framework_bench.cli import app

    monkeypatch.setenv("FBENCH_UNCHECKED", "initial_weights,parity,machine")  # the fakes build no model; not the load

    ok = CliRunner().invoke(app, ["check-backend", "fake_ok"])
    assert ok.exit_code == 0, ok.output
    verdicts = {cells[1].strip(): cells[2].strip() for line in ok.output.splitlines()
                if len(cells := line.split("│")) > 3 and cells[1].strip()}  # not a wrapped detail's next line
    assert verdicts == {p: "pass" for p in ("run", "tokens", "steps", "rows", "throughput", "parameters", "settings",
                                            "clock", "pauses", "gaps", "warmup_time", "warmup", "cpu", "update",
                                            "losses_in_time", "initial_reveal", "warmup_update", "median_step")}
    liar = CliRunner().invoke(app, ["check-backend", "fake_double_tokens"])
    assert liar.exit_code == 1
    assert "fail" in liar.output and "reports 1024 tokens" in liar.output


@pytest.mark.slow  # starts a framework's or the host's own process
def test_conformance_for_a_plugins_own_pytest(fakes, tmp_path, monkeypatch):
    from framework_bench import testing

    monkeypatch.setenv("FBENCH_UNCHECKED", "initial_weights,parity,machine")  # the fakes build no model

    report = testing.assert_conforms("fake_ok", tmp_path)
    assert report.passed and [p.name for p in report.points][0] == "run"
    with pytest.raises(AssertionError, match="rows: step 1 fed 1 row"):
        testing.assert_conforms("fake_wrong_rows", tmp_path)
    crashed = testing.check_backend("fake_crash", tmp_path)
    assert not crashed.passed and crashed.points[0].detail.startswith("status failed")


@pytest.mark.slow  # starts a framework's or the host's own process
def test_compare_names_each_setting_that_differs_and_the_invalid_run(fakes, tmp_path):
    from typer.testing import CliRunner

    from framework_bench.cli import app

    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_ok,fake_double_tokens",
                                   "--db", str(tmp_path / "r.sqlite"), "--out", str(tmp_path / "plots")])
    assert res.exit_code == 1, res.output  # a run that is not ok (here invalid) makes compare exit non-zero
    assert "tiny_cpu: 1 setting(s) differ between backends (matched settings)" in res.output
    # one setting per line, each backend's value in its column (the backends in name order)
    assert "setting fake_double_tokens fake_ok speed trainer fake-loop-double_tokens fake-loop-ok" in " ".join(res.output.split())
    assert "fake_double_tokens: invalid" in res.output and "tokens check failed" in res.output
    report = (tmp_path / "plots" / "report.md").read_text()
    assert "| ⚠ trainer | fake-loop-double_tokens | fake-loop-ok |" in report
