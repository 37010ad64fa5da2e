"""Parity against the reference (issue 20, items 2-4): from the same initial weights and rows,
each backend's canonical step-1 loss equals the torch reference's within 1e-5 (fp32), at
grad_accum 1 and 2, with each framework's loss normalisation named; and the parity judgement
itself on figures where it must pass or fail."""

from __future__ import annotations

import pytest

from backend_helpers import CPU
from fbench_fixtures import backend_env_or_skip

from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.spec import scenario
from framework_bench.data.packing import pack
from framework_bench.measure.losses import parity
from framework_bench.measure.metrics import RunResult
from framework_bench.testing import parity_variants

BACKENDS = ("torch", "xtuner", "llamafactory")


def ok(backend: str, curve: dict[int, float], seed: int = 1024, normalisation: str = "token mean") -> RunResult:
    return RunResult(backend=backend, scenario="tiny_cpu", status="ok", seed=seed, loss_curve=curve,
                     settings={"loss_normalization": normalisation})


def test_parity_judges_step_one_and_names_what_is_missing():
    ref = ok("torch", {1: 6.2760124, 2: 6.2086824})
    # another normalisation: step 1 judged, later steps shown
    other = parity(ok("xtuner", {1: 6.2760124 * (1 + 5e-6), 2: 6.3}, normalisation="mean of means"), ref, "fp32")
    assert other.status == "pass" and "normalisation differs" in other.detail
    # the same normalisation: every step judged (an update skipped shows at step 2)
    same = parity(ok("torch_copy", {1: 6.2760124, 2: 6.2760124}), ref, "fp32")
    assert same.status == "fail" and same.detail.startswith("step 2 off")
    assert parity(ok("torch_copy", {1: 6.2760124, 2: 6.2086824}), ref, "fp32").status == "pass"
    off = parity(ok("xtuner", {1: 6.3272, 2: 6.3}), ref, "fp32")
    assert off.status == "fail" and "6.3272000 vs torch 6.2760124" in off.detail
    assert parity(ok("xtuner", {1: 6.30}), ref, "bf16").status == "pass"  # 0.4 % within bf16's 1e-2
    assert "seeds differ" in parity(ok("xtuner", {1: 6.2760124}, seed=1), ref, "fp32").detail
    assert "no per-micro-batch losses" in parity(ok("lying", {}), ref, "fp32").detail
    failed = RunResult(backend="xtuner", scenario="tiny_cpu", status="invalid", reason="initial_weights check failed")
    assert "ended invalid" in parity(failed, ref, "fp32").detail


def test_check_backend_variants_are_grad_accum_2_and_two_processes_with_zero_2_next():
    (ga_label, [ga]), (two_label, two) = parity_variants(scenario.load("tiny_cpu"))
    assert ga_label == "grad_accum 2" and ga.grad_accum == 2 and two_label == "2 processes"
    assert [s.name for s in two] == ["multiproc_tiny_cpu_1x2", "multiproc_tiny_cpu_zero2"]
    assert all(s.cluster.gpus == 2 for s in two) and two[1].zero_stage == 2


@pytest.fixture(scope="module", params=[1, 2], ids=["grad_accum1", "grad_accum2"])
def three_runs(request, tmp_path_factory, tiny_cpu_run):
    for b in BACKENDS:
        backend_env_or_skip(b)
    if request.param == 1:  # the session's shared runs of tiny_cpu
        return tiny_cpu_run(BACKENDS[0])[0], {b: tiny_cpu_run(b)[2] for b in BACKENDS}
    scn = scenario.load("tiny_cpu")
    scn = scn.model_copy(update={"name": f"tiny_cpu_grad_accum{request.param}", "grad_accum": request.param})
    data = pack(scn, progress=False, say=lambda msg: None)
    root = tmp_path_factory.mktemp("runs")
    return scn, {b: pipeline.run_one(b, scn, RunOptions(root=root), data=data, machine=CPU) for b in BACKENDS}


@pytest.mark.slow  # real runs of the three trainers
def test_same_initial_weights_and_step_one_loss_as_the_reference(three_runs):
    scn, runs = three_runs
    for b, r in runs.items():
        assert r.status == "ok", (b, r.reason)
        checks = {c.name: c for c in r.checks}
        assert checks["initial_weights"].status == "pass", (b, checks["initial_weights"])
        assert r.seed == 1024 and sorted(r.loss_curve) == list(range(1, scn.steps.total + 1))
        assert r.settings["loss_normalization"], b
        # keys once recorded on one side only appear for every backend, read from its live objects
        assert r.settings["sequence_parallel"] == 1 and r.settings["token_count_sync"] is False, b
        assert r.settings["compile"] is False, b
        check = parity(r, runs["torch"], scn.precision)
        assert check.status == "pass", (b, check.detail)
        assert abs(r.loss_curve[1] / runs["torch"].loss_curve[1] - 1) <= 1e-5
    normalisations = {b: r.settings["loss_normalization"] for b, r in runs.items()}
    assert "before the shift" in normalisations["llamafactory"]
    assert "per micro-batch" in normalisations["xtuner"] and "over the optimizer step" in normalisations["torch"]
