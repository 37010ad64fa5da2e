"""The fp32 twin: its scenario and its check from results alone, then real twins of a sequence-
parallel bf16 scenario (SP 2 over two CPU processes: the torch reference's Ulysses attends with
SDPA, which has fp32 kernels). The twins of a non-split bf16 scenario: tests/test_model_lies.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fbench_fixtures import MULTIPROCESS_TIMEOUT

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import BLOCKING, UNCHECKED_ENV, Check
from framework_bench.plugins.contract import Job
from framework_bench.run import compare, pipeline, referee, twin
from framework_bench.run.launchers import base as launch
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.worker.files import read_metrics


def test_a_bf16_scenario_has_an_fp32_twin_of_a_few_steps_and_an_fp32_one_none():
    s = scenario.load("llama2_7b_8k")
    t = twin.twin_of(s)
    assert (t.name, t.precision, t.steps.total) == ("llama2_7b_8k_fp32_twin", "fp32", 5)
    assert (t.arch, t.micro_batch, t.grad_accum, t.context_length, t.zero_stage) == (
        s.arch, s.micro_batch, s.grad_accum, s.context_length, s.zero_stage)
    assert twin.twin_of(scenario.load("tiny_cpu")) is None  # judged at fp32 already


def test_a_sequence_parallel_or_varlen_twin_keeps_the_split_and_the_per_document_attention():
    s = scenario.load("llama2_7b_128k")
    long = twin.twin_of(s)
    assert (long.precision, long.sequence_parallel, long.cluster) == ("fp32", 8, s.cluster)
    varlen = scenario.load("llama2_7b_8k").model_copy(update={"attention": "varlen"})
    assert twin.twin_of(varlen).attention == "varlen"


def _twin(status: str, settings: dict | None = None, **checks: str) -> RunResult:
    return RunResult(backend="x", scenario="s_fp32_twin", status=status, reason="why it ended so",
                     settings=settings or {},
                     checks=[Check(name=n, status=v, detail=f"{n} detail") for n, v in checks.items()])


def _check(t: RunResult | None, settings: dict | None = None) -> Check:
    return twin.check(RunResult(backend="x", scenario="s", status="ok", settings=settings or {}), t)


def test_the_twin_check_takes_only_the_twins_training_step_checks():
    ok = _check(_twin("ok", parity="pass", update="pass", update_parity="pass", update_parts="pass", clock="pass"))
    assert ok.status == "pass"
    wrong = _check(_twin("invalid", parity="pass", update_parity="fail", clock="pass"))
    assert wrong.status == "fail" and wrong.detail == "in fp32: update_parity: update_parity detail"
    slow = _check(_twin("invalid", parity="pass", update_parity="pass", warmup="fail"))  # the twin's own timing
    assert slow.status == "pass"
    assert _check(_twin("failed")).status == "unverified" and "why it ended so" in _check(_twin("failed")).detail
    assert _check(_twin("unverified", update="pass")).status == "unverified"  # no reference twin fit to judge it
    assert twin.CHECK in BLOCKING


def test_a_twin_that_cannot_run_or_did_not_leaves_the_run_unverified_naming_why():
    s = scenario.load("llama2_7b_128k")
    ran = []

    def refusing(backend: str, trained: scenario.Scenario, scheme: str | None) -> RunResult:
        ran.append((backend, trained.precision, trained.sequence_parallel))
        return RunResult(backend=backend, scenario=trained.name, status="unsupported",
                         reason="sequence_parallel 8 needs flash_attn and deepspeed")

    run = RunResult(backend="x", scenario=s.name, status="ok")
    reference = RunResult(backend="torch", scenario=s.name, status="ok")
    refused = referee._twin_check(run, reference, s, refusing)
    assert ran == [("x", "fp32", 8)]  # the sequence-parallel twin is asked for, SP kept
    assert refused.status == "unverified" and refused.detail == (
        "its fp32 twin cannot run: sequence_parallel 8 needs flash_attn and deepspeed")
    none_run = referee._twin_check(run, reference, s, None)
    assert none_run.status == "unverified" and "no fp32 twin was run beside it" in none_run.detail


def test_a_twin_whose_ledger_is_not_the_runs_fails_but_for_the_precisions_settings():
    run = {"grad_clip": 1.0, "betas": "0.9,0.999", "autocast_dtype": "bfloat16", "param_dtype": "float32",
           "attention": "flash_attention_2", "sequence_parallel": 8}
    steps = dict(parity="pass", update="pass", update_parity="pass", update_parts="pass")
    fp32 = {**run, "autocast_dtype": None, "attention": "sdpa"}
    assert _check(_twin("ok", fp32, **steps), run).status == "pass"
    unclipped = _check(_twin("ok", {**fp32, "grad_clip": None, "sequence_parallel": 1}, **steps), run)
    assert unclipped.status == "fail" and unclipped.detail == (
        "in fp32: its fp32 twin trained otherwise than it (grad_clip 1.0 in bf16, None in fp32, sequence_parallel 8 "
        "in bf16, 1 in fp32): the twin did not judge its step")
    unsaid = _check(_twin("ok", {k: v for k, v in fp32.items() if k != "betas"}, **steps), run)
    assert unsaid.status == "fail" and "betas '0.9,0.999' in bf16, not recorded in fp32" in unsaid.detail
    assert _check(_twin("ok", {}, **steps), run).status == "pass"  # no ledger: the twin's own `settings` check says so


# --- real twins of a sequence-parallel bf16 scenario --------------------------------------------

# SP 2 (Ulysses over FSDP2 ZeRO-3) on two CPU processes, in bf16: autocast on the CPU.
SP_BF16_BACKENDS = ("lying_honest", "lying_no_clipping", "lying_bf16_no_clipping")


@pytest.fixture(scope="module")
def sp_bf16(liars, tmp_path_factory):
    """One compare of SP 2 in bf16: the honest copy of the torch worker, the copy without gradient
    clipping and the one skipping it in bf16 only (its ledger saying so), torch the reference;
    each run's fp32 twin (SP 2 kept) beside the reference's. (scenario, {backend: result}, mp)."""
    import fbench_lying_recipes

    site = tmp_path_factory.mktemp("recipe-site")
    liars.register_through_entry_points(site, fbench_lying_recipes.ENTRY_POINTS, "fbench-lying-recipes")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
        sp2 = scenario.load("multiproc_tiny_cpu_sp2")
        s = sp2.model_copy(update={"name": "multiproc_tiny_cpu_sp2_bf16", "precision": "bf16"})
        options = RunOptions(root=tmp_path_factory.mktemp("sp-bf16"), timeout=MULTIPROCESS_TIMEOUT)
        results = compare.compare([s], list(SP_BF16_BACKENDS), options, warmup_rounds=0)
        yield s, {r.backend: r for r in results}, mp


def _twin_check(r: RunResult) -> Check:
    return {c.name: c for c in r.checks}[twin.CHECK]


@pytest.mark.slow
def test_an_honest_sequence_parallel_bf16_run_passes_its_sequence_parallel_fp32_twin(sp_bf16):
    _, results, _ = sp_bf16
    honest = results["lying_honest"]
    assert honest.status == "ok", honest.reason
    check = _twin_check(honest)
    assert check.status == "pass" and "parity pass" in check.detail and "update_parity pass" in check.detail, check
    assert results["torch"].status == "ok" and twin.CHECK not in {c.name for c in results["torch"].checks}
    folder = Path(next(n for n in honest.notes if "fp32 twin (ok" in n).rsplit(": ", 1)[1].removesuffix(")"))
    trained = Job.model_validate_json((folder / "job.json").read_text()).scenario
    assert (trained.precision, trained.sequence_parallel, trained.cluster.gpus) == ("fp32", 2, 2)
    assert {(m["rank"], m["tokens"]) for m in read_metrics(folder)} == {(0, 256), (1, 256)}  # each rank half a row


@pytest.mark.slow
def test_no_clipping_under_sequence_parallel_bf16_fails_its_fp32_twin_and_passes_without_it(sp_bf16):
    s, results, mp = sp_bf16
    r = results["lying_no_clipping"]
    assert r.status == "invalid" and "fp32_twin check failed: in fp32" in r.reason, r.reason
    assert {c.name for c in r.checks if c.status == "fail" and c.name in BLOCKING} == {twin.CHECK}  # bf16 hides it
    mp.setenv(UNCHECKED_ENV, twin.CHECK)
    try:
        again = referee.judge(pipeline.finish(pipeline.Prepared.of_run_dir(r.run_dir, r.backend, None),
                                              launch.Outcome("ok", 0, r.wall_seconds, "")), results["torch"], s)
    finally:
        mp.delenv(UNCHECKED_ENV)
    assert again.status == "ok", again.reason  # the lie is live


@pytest.mark.slow
def test_clipping_skipped_in_bf16_only_fails_by_the_twins_ledger(sp_bf16):
    """Its fp32 twin trains honestly, and passes parity; the bf16 run's ledger says no clipping,
    the twin's says 1.0: the twin judged another step than the run's."""
    _, results, _ = sp_bf16
    r = results["lying_bf16_no_clipping"]
    assert r.status == "invalid", r.reason
    check = _twin_check(r)
    assert check.status == "fail" and "grad_clip None in bf16, 1.0 in fp32" in check.detail, check.detail
    assert "parity: " not in check.detail  # the twin's own step was the honest fp32 one


# --- the twins of a SLURM round: trained in the round's job, read back by results collect --------

from slurm_cluster import real_slurm, slurm_cluster  # noqa: E402,F401 - the fixtures: a one-node Slurm of this machine


@pytest.mark.slow
def test_a_slurm_round_of_a_bf16_scenario_trains_its_twins_in_its_job_and_judges_them(liars, real_slurm, tmp_path,
                                                                                      home_with_envs):
    """On a real Slurm: the honest copy's fp32 twin passes and the copy without gradient clipping's
    fails, as on the local launcher: the twins run in the round's job after its runs, and collect
    reads them back."""
    import json

    from typer.testing import CliRunner

    from framework_bench.cli import app
    # bf16 at 1k tokens a row, as tests/test_model_lies.py's bf16 compare (its warm-up on a CPU's bf16)
    bf16 = tmp_path / "tiny_cpu_bf16_slurm.yaml"
    bf16.write_text((scenario.SCENARIO_DIR / "tiny_cpu.yaml").read_text()
                    .replace("precision: fp32", "precision: bf16").replace("context_length: 512", "context_length: 1024"))
    db = tmp_path / "slurm.sqlite"
    res = CliRunner().invoke(app, ["compare", "--scenario", str(bf16), "--backends", "lying_honest,lying_no_clipping",
                                   "--launcher", "slurm", "--wait", "--poll", "1", "--db", str(db)])
    rows = {r["backend"]: r for r in json.loads(CliRunner().invoke(
        app, ["results", "export", "--db", str(db), "--format", "json"]).stdout)}
    checks = {b: {c["name"]: c for c in r["checks"]} for b, r in rows.items()}
    assert rows["lying_honest"]["status"] == "ok", (res.output, rows["lying_honest"]["reason"])
    assert checks["lying_honest"][twin.CHECK]["status"] == "pass", checks["lying_honest"][twin.CHECK]
    assert rows["lying_no_clipping"]["status"] == "invalid", rows["lying_no_clipping"]["reason"]
    assert checks["lying_no_clipping"][twin.CHECK]["status"] == "fail", checks["lying_no_clipping"][twin.CHECK]
    submitted = json.loads((Path(rows["lying_honest"]["run_dir"]) / "slurm.json").read_text())
    assert {"fp32_twin/lying_honest", "fp32_twin/torch"} <= set(submitted["judging"])  # trained in the round's job
    assert res.exit_code == 1, res.output  # an invalid run fails the command
