"""The fp32 twin's scenario and its check, from results alone (the real twins: tests/test_model_lies.py)."""

from __future__ import annotations

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import BLOCKING, Check
from framework_bench.run import referee, twin
from framework_bench.scenario import scenario


def test_a_bf16_scenario_has_an_fp32_twin_of_a_few_steps_and_an_fp32_or_flash_only_one_none():
    s = scenario.load("llama2_7b_8k")
    t = twin.twin_of(s)
    assert (t.name, t.precision, t.steps.total) == ("llama2_7b_8k_fp32_twin", "fp32", 5)
    assert (t.arch, t.micro_batch, t.grad_accum, t.context_length, t.zero_stage) == (
        s.arch, s.micro_batch, s.grad_accum, s.context_length, s.zero_stage)
    assert twin.twin_of(scenario.load("tiny_cpu")) is None  # judged at fp32 already
    long = scenario.load("llama2_7b_128k")
    assert twin.twin_of(long) is None and "sequence parallel needs flash-attention" in twin.no_twin(long)


def _twin(status: str, **checks: str) -> RunResult:
    return RunResult(backend="x", scenario="s_fp32_twin", status=status, reason="why it ended so",
                     checks=[Check(name=n, status=v, detail=f"{n} detail") for n, v in checks.items()])


def test_the_twin_check_takes_only_the_twins_training_step_checks():
    def check(t):
        return twin.check(RunResult(backend="x", scenario="s", status="ok"), t)
    ok = check(_twin("ok", parity="pass", update="pass", update_parity="pass", update_parts="pass", clock="pass"))
    assert ok.status == "pass"
    wrong = check(_twin("invalid", parity="pass", update_parity="fail", clock="pass"))
    assert wrong.status == "fail" and wrong.detail == "in fp32: update_parity: update_parity detail"
    slow = check(_twin("invalid", parity="pass", update_parity="pass", warmup="fail"))  # the twin's own timing
    assert slow.status == "pass"
    assert check(_twin("failed")).status == "unverified" and "why it ended so" in check(_twin("failed")).detail
    assert check(_twin("unverified", update="pass")).status == "unverified"  # no reference twin fit to judge it
    assert check(_twin("unsupported")).status == "skipped"
    assert twin.check(RunResult(backend="x", scenario="s", status="ok"), None).status == "skipped"
    assert twin.CHECK in BLOCKING


def test_the_referee_skips_the_twin_of_a_sequence_parallel_run_naming_why():
    s = scenario.load("llama2_7b_128k")
    ran = []
    found = referee._twin_check(RunResult(backend="x", scenario=s.name, status="ok"),
                                RunResult(backend="torch", scenario=s.name, status="ok"), s,
                                lambda *a: ran.append(a))
    assert found.status == "skipped" and "no fp32 kernels" in found.detail and ran == []
