"""The sanity anchor: the torch reference on llama2_7b_8k_1gpu on an H200 is held against
the 1.170 s/step it measured there on one H200; outside ±10 % the run is flagged, never invalidated."""

from __future__ import annotations

import pytest

from framework_bench.scenario import scenario
from framework_bench.measure import verify
from framework_bench.plugins.contract import StepMetric, WorkerReport

SCN = scenario.load("llama2_7b_8k_1gpu")


def report(step_seconds: float, trainer: str = "torch-loop", gpu: str | None = "NVIDIA H200") -> WorkerReport:
    steps = [StepMetric(step=i, seconds=5.0 if i <= SCN.steps.warmup else step_seconds, tokens=8192)
             for i in range(1, SCN.steps.total + 1)]
    return WorkerReport(steps=steps, settings={"trainer": trainer, "device_name": gpu})


@pytest.mark.parametrize("seconds", [1.170, 1.06, 1.28])
def test_within_ten_percent_passes(seconds):
    check = verify.check_anchor(SCN, report(seconds))
    assert check.name == "anchor" and check.status == "pass"
    assert "1.170 s" in check.detail  # the figure it was held against, warm-up steps left out


@pytest.mark.parametrize("seconds", [1.04, 1.30, 2.0])
def test_outside_ten_percent_is_flagged_naming_the_figure(seconds):
    check = verify.check_anchor(SCN, report(seconds))
    assert check.status == "fail" and "1.170 s" in check.detail and "regression" in check.detail
    reason, flags = verify.fold([check])
    assert reason is None  # flagged: the row stays, with the flag beside it
    assert flags == [f"anchor: {check.detail}"]


def test_applies_only_to_the_reference_loop_on_an_h200_on_that_scenario():
    assert verify.check_anchor(SCN, report(2.0, gpu="NVIDIA A100-SXM4-80GB")) is None
    assert verify.check_anchor(SCN, report(2.0, gpu=None)) is None
    assert verify.check_anchor(SCN, report(2.0, trainer="hf-trainer")) is None
    other = scenario.load("llama2_7b_32k_1gpu")
    assert verify.check_anchor(other, report(2.0)) is None
