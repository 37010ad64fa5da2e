"""ZeRO-2 and ZeRO-3 for real on this CPU: 1 node x 2 processes through torchrun (gloo), each
backend through its own DeepSpeed path (XTuner: FlexibleRunner + DeepSpeedStrategy;
LLaMA-Factory: HF Trainer + DeepSpeed). The workers check that the engine in effect is
DeepSpeed at the asked stage; both ranks must train every step on their own rows; each run is
judged against the torch reference's FSDP2 run of the stage (one per stage and loss
normalisation, shared): LLaMA-Factory's against the one that divides by every process's labels."""

import pytest

from fbench_fixtures import MULTIPROCESS_TIMEOUT, backend_env_or_skip
from framework_bench.measure import losses
from framework_bench.run import pipeline, referee
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.worker.files import read_metrics, read_worker_report


@pytest.fixture(scope="module")
def fsdp2_reference(torch_zero_run):
    """`fsdp2_reference(stage, loss_scheme)`: the torch reference's run of the stage's scenario
    with that loss normalisation, made once for both backends (one host process: the same
    projection vector as theirs); the session's `torch_zero_run`, which the torch backend's own
    ZeRO-3 test reads too."""
    return torch_zero_run


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["xtuner", "llamafactory"])
@pytest.mark.parametrize("stage", [2, 3])
def test_zero_on_two_cpu_processes(backend, stage, fsdp2_reference):
    backend_env_or_skip(backend)
    s = scenario.load(f"multiproc_tiny_cpu_zero{stage}")
    assert s.zero_stage == stage and s.cluster.gpus == 2 and s.cluster.device == "cpu"
    r = pipeline.run_one(backend, s, RunOptions(launcher="torchrun", timeout=MULTIPROCESS_TIMEOUT))
    assert r.status == "ok", r.reason
    assert "torch.distributed.run" in (r.run_dir / "plan.json").read_text()
    steps = read_metrics(r.run_dir)
    for rank in (0, 1):
        mine = [m for m in steps if m["rank"] == rank]
        assert [m["step"] for m in mine] == list(range(1, s.steps.total + 1))  # both ranks, every step
        assert all(m["tokens"] == s.context_length for m in mine)  # one rank's rows, not the world's
    assert read_worker_report(r.run_dir)["zero_stage_in_effect"] == stage
    assert r.steps_measured == s.steps.measured and r.tgs > 0
    reference = fsdp2_reference(stage)
    assert reference.status == "ok" and reference.settings["zero_stage"] == stage, reference.reason
    # LLaMA-Factory's HF Trainer divides by every process's labels: judged against the reference
    # trained so, as the referee does (`judging_reference`)
    needed = losses.needed_reference_loss(r, reference).scheme
    assert needed == ("world_label_mean" if backend == "llamafactory" else None)
    judging = fsdp2_reference(stage, needed)
    assert judging.status == "ok", judging.reason
    judged = {c.name: c for c in referee.judge(r, judging, s).checks}
    assert r.status == "ok" and judged["parity"].status == judged["update_parity"].status == "pass", r.reason
