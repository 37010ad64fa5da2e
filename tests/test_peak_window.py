"""Peak memory means the same for every backend: each step's line holds that step's window
(the SDK's StepTimer), and a run's figure is the max over its measured steps, warm-up excluded."""

from backend_helpers import tiny
from framework_bench.measure import metrics
from framework_bench.plugins.contract import StepMetric

GiB = 2**30


def test_run_peak_is_the_max_over_measured_steps():
    scn = tiny(steps={"warmup": 1, "measured": 2})
    steps = [StepMetric(step=1, seconds=1, tokens=512, peak_mem_bytes=9 * GiB, peak_reserved_bytes=12 * GiB),  # warm-up
             StepMetric(step=2, seconds=1, tokens=512, peak_mem_bytes=3 * GiB, peak_reserved_bytes=5 * GiB),
             StepMetric(step=3, seconds=1, tokens=512, peak_mem_bytes=4 * GiB, peak_reserved_bytes=4 * GiB),
             StepMetric(step=3, seconds=1, tokens=512, rank=1, peak_mem_bytes=2 * GiB, peak_reserved_bytes=6 * GiB)]
    out = metrics.figures(scn, steps, None)
    assert out["peak_mem_bytes"] == 4 * GiB and out["peak_reserved_bytes"] == 6 * GiB


def test_cpu_steps_have_no_reserved_figure():
    scn = tiny(steps={"warmup": 0, "measured": 1})
    out = metrics.figures(scn, [StepMetric(step=1, seconds=1, tokens=512, peak_mem_bytes=GiB)], None)
    assert out["peak_mem_bytes"] == GiB and out["peak_reserved_bytes"] is None
