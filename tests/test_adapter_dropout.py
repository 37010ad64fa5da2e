"""Native adapters behind a claim of dropout: a native LoRA run that claims adapter dropout is
judged at step 1 only (dropout's draws are no two frameworks' alike, and at step 1 B is zero
whatever the adapters), so its adapters are judged in its dropout twin: the same backend on the
scenario with the adapters its ledger claims and dropout 0, in matched settings, against the
reference trained so (framework_bench/run/dropout_twin.py). A copy of the torch worker
(tests/lying_backends/fbench_lying_adapters.py) that trains r=8 on q_proj and v_proj while its
ledger claims the scenario's adapters on every linear and dropout 0.1 ends `invalid` in `compare`;
with `dropout_twin` off it ends `ok`: the lie is live."""

from __future__ import annotations

import os

import pytest

from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import BLOCKING, UNCHECKED_ENV, Check
from framework_bench.run import compare, dropout_twin, pipeline, referee
from framework_bench.run.launchers import base as launch
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario

SCENARIO = scenario.load("tiny_cpu_lora")
TARGETS = "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"
# ms-swift's native adapters, as its ledger says them
SWIFT = {"settings_mode": "native", "lora_rank": 8, "lora_alpha": 32.0, "lora_dropout": 0.05, "lora_targets": TARGETS,
         "lora_head_adapted": False, "lora_rslora": False, "lora_dora": False}


def _run(settings: dict, status: str = "ok", checks: tuple = ()) -> RunResult:
    return RunResult.model_construct(backend="swift", scenario=SCENARIO.name, status=status, settings=settings,
                                     checks=list(checks), notes=[], reason=None, run_dir=None, loss_curve={1: 2.0})


def test_a_native_run_claiming_dropout_gets_a_twin_with_its_claimed_adapters_at_dropout_0():
    twin = dropout_twin.twin_of(SCENARIO, _run(SWIFT))
    assert (twin.finetune.rank, twin.finetune.alpha, twin.finetune.dropout) == (8, 32.0, 0.0)
    assert ",".join(sorted(twin.finetune.targets)) == TARGETS
    assert (twin.steps.warmup, twin.steps.measured, twin.name) == (1, 4, "tiny_cpu_lora_dropout_twin")
    assert dropout_twin.twin_of(SCENARIO, _run({**SWIFT, "settings_mode": "matched"})) is None
    assert dropout_twin.twin_of(SCENARIO, _run({**SWIFT, "lora_dropout": 0.0})) is None
    assert "lora_dora" in dropout_twin.twin_of(SCENARIO, _run({**SWIFT, "lora_dora": True}))
    assert "does not say which adapters" in dropout_twin.twin_of(SCENARIO, _run({**SWIFT, "lora_rank": None}))
    assert "do not fit the model" in dropout_twin.twin_of(SCENARIO, _run({**SWIFT, "lora_targets": "q_proj,w_qkv"}))


def test_the_dropout_twin_check_is_never_ok_unless_its_twin_trained_the_claimed_adapters_without_dropout():
    run = _run(SWIFT)
    twin = {**SWIFT, "settings_mode": "matched", "lora_dropout": 0.0}
    passed = [Check(name=n, status="pass", detail="") for n in dropout_twin.JUDGED]

    def judged(settings, status="ok", checks=passed):
        return dropout_twin.check(run, _run(settings, status, checks))
    assert judged(twin).status == "pass"
    assert dropout_twin.check(run, None).status == "unverified"
    assert dropout_twin.check(run, None, why_none="no reference trains adapters with lora_dora").status == "unverified"
    with_dropout = judged({**twin, "lora_dropout": 0.05})
    assert with_dropout.status == "unverified" and "cannot train these adapters without dropout" in with_dropout.detail
    other = judged({**twin, "lora_targets": "q_proj,v_proj"})
    assert other.status == "unverified" and "other adapters than it claims" in other.detail
    off = judged(twin, "invalid", [Check(name="parity", status="fail", detail="step 2 off by 3.1e-02")])
    assert off.status == "fail" and off.detail == "at dropout 0: parity: step 2 off by 3.1e-02"
    assert judged(twin, "unsupported", []).status == judged(twin, "failed", []).status == "unverified"
    assert "dropout_twin" in BLOCKING


@pytest.fixture(scope="module")
def runs(liars, tmp_path_factory):
    """One native compare of the lie, torch the reference: {backend: RunResult}."""
    from fbench_lying_adapters import ENTRY_POINTS

    site = tmp_path_factory.mktemp("adapters-site")
    liars.register_through_entry_points(site, ENTRY_POINTS, "fbench-lying-adapters")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))
        results = compare.compare([SCENARIO], ["lying_claims_dropout"],
                                  RunOptions(root=tmp_path_factory.mktemp("adapters"), settings_mode="native"))
        yield {r.backend: r for r in results}


@pytest.mark.slow  # real runs of the torch worker's copy, its twin and the reference's judging run
def test_adapters_smaller_than_claimed_behind_dropout_are_invalid_in_the_dropout_twin_and_live_without_it(runs, monkeypatch):
    lie, reference = runs["lying_claims_dropout"], runs["torch"]
    assert reference.status == "ok", reference.reason
    checks = {c.name: c for c in lie.checks}
    assert (lie.settings["lora_dropout"], lie.settings["lora_targets"]) == (0.1, TARGETS)
    assert checks["trainable"].status == checks["parity"].status == "pass"  # the ledger agrees with itself; step 1
    assert lie.status == "invalid" and "dropout_twin check failed: at dropout 0: " in lie.reason, lie.reason
    assert {c.name for c in lie.checks if c.status == "fail" and c.name in BLOCKING} == {"dropout_twin"}
    assert any("its adapters judged in its dropout twin, at dropout 0 (invalid" in n for n in lie.notes), lie.notes

    monkeypatch.setenv(UNCHECKED_ENV, dropout_twin.CHECK)
    again = referee.judge(pipeline.finish(pipeline.Prepared.of_run_dir(lie.run_dir, lie.backend, None),
                                          launch.Outcome("ok", 0, lie.wall_seconds, "")), reference, SCENARIO)
    assert again.status == "ok", again.reason
