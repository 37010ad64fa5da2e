"""One-GPU plans: every CUDA run is given a process group of one (XTuner's worker sets it up
itself and keeps mmengine's launcher "none", so the model is not DDP-wrapped: see
test_one_gpu_settings.py) and sees only its own GPUs. Host side only: no GPU needed."""

from __future__ import annotations

import ast
import json

import pytest

from backend_helpers import H100x8, make_job, ready_env, tiny
from framework_bench.run.launchers import base as launch
from framework_bench.run.launchers import executor_for
from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import Machine

ONE_GPU = Machine(gpus=1, gpu_name="NVIDIA H200", gpu_memory_gib=139)
PG_VARS = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}


def llama2_7b_8k_one_gpu_zero3() -> scenario.Scenario:
    """The published 8k row edited to one GPU, ZeRO-3 kept."""
    data = scenario.load("llama2_7b_8k").model_dump()
    data["name"] = "llama2_7b_8k_1gpu_zero3_edit"
    data["cluster"] |= {"gpus_per_node": 1, "gpus": 1}
    return scenario.Scenario.model_validate(data)


@pytest.mark.parametrize("backend, versions", [("xtuner", {"xtuner": "0.2.0"}), ("llamafactory", {"llamafactory": "0.9.5"})])
def test_one_gpu_zero3_plans_a_process_group(backend, versions, tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    plugin = plugins.get(backend)
    scn = llama2_7b_8k_one_gpu_zero3()
    env = ready_env(backend, versions, "cuda", "deepspeed")
    assert plugin.check(scn, ONE_GPU, env) is None
    job = make_job(backend, tmp_path, scn)
    plan = plugin.plan(job, env)
    assert PG_VARS.items() <= plan.env.items()
    assert 1024 <= int(plan.env["MASTER_PORT"]) < 65536
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "0"  # one process on an 8-GPU host sees one GPU
    assert launch.default_launcher(job.scenario) == "local"
    assert executor_for("local").argv(plan, job)[1:3] == ["-m", plan.module]
    if backend == "xtuner":
        values = {n.targets[0].id: ast.unparse(n.value) for n in ast.parse(plan.files["mmengine_config"].read_text()).body
                  if isinstance(n, ast.Assign)}
        assert "DeepSpeedStrategy" in values["strategy"] and "'stage': 3" in values["strategy"]
        assert ast.literal_eval(values["runner_type"]) == "FlexibleRunner"
    else:
        assert json.loads(plan.files["deepspeed"].read_text())["zero_optimization"]["stage"] == 3


@pytest.mark.parametrize("backend, versions", [("xtuner", {"xtuner": "0.2.0"}), ("llamafactory", {"llamafactory": "0.9.5"})])
def test_one_gpu_zero0_still_gets_a_process_group(backend, versions, tmp_path, monkeypatch):
    """XTuner's dispatched attention calls dist.get_rank() even at ZeRO 0 (flash-attn installed)."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,6")
    plugin = plugins.get(backend)
    scn = tiny(cluster={"device": "cuda"}, precision="bf16")
    env = ready_env(backend, versions, "cuda")
    plan = plugin.plan(make_job(backend, tmp_path, scn), env)
    assert PG_VARS.items() <= plan.env.items()
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "5"  # the first of those the user made visible


def test_several_gpus_leave_the_ranks_to_torchrun(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    scn = scenario.load("llama2_7b_8k")
    for backend, versions in (("xtuner", {"xtuner": "0.2.0"}), ("llamafactory", {"llamafactory": "0.9.5"})):
        env = ready_env(backend, versions, "cuda", "deepspeed")
        job = make_job(backend, tmp_path / backend, scn)
        plan = plugins.get(backend).plan(job, env)
        assert "RANK" not in plan.env and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        assert plugins.get(backend).check(scn, H100x8, env) is None


def test_cpu_plans_pin_no_gpus(tmp_path):
    scn = tiny(cluster={"device": "cpu"})
    plan = plugins.get("xtuner").plan(make_job("xtuner", tmp_path, scn), ready_env("xtuner", {"xtuner": "0.2.0"}, "cpu"))
    assert "CUDA_VISIBLE_DEVICES" not in plan.env and "RANK" not in plan.env  # plain single CPU process
