"""LLaMA-Factory's v1 trainer (its sequence-parallel path) at 34B/70B scale: how the model is
initialised, one writer per shared run folder, and the KV-head refusal."""

from __future__ import annotations

import json

import pytest

import backend_helpers as helpers
from backend_helpers import H100x8

from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario

from fbench_llamafactory import train_args


@pytest.fixture(scope="module")
def llamafactory():
    return plugins.get("llamafactory")


def _env():
    return helpers.ready_env("llamafactory", {"llamafactory": "0.9.5"}, "cuda", "deepspeed", "flash-attn")


@pytest.mark.parametrize("name", ["yi34b_256k", "llama2_70b_32k"])
def test_v1_plan_builds_from_config_on_rank0_only(llamafactory, tmp_path, name):
    job = helpers.make_job("llamafactory", tmp_path, scenario.load(name))
    plan = llamafactory.plan(job, _env())
    args = json.loads(plan.files["train_args"].read_text())
    assert args["init_config"] == {"name": "init_on_rank0"}
    model_dir = plan.files["model_dir"]
    # config and tokenizer only: no weight file is written, by the plan or for the worker to read
    assert (model_dir / "config.json").exists()
    assert not [p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin")]


@pytest.mark.parametrize("name", ["llama2_70b_256k", "llama2_70b_1m"])
def test_kv_heads_fewer_than_sp_ranks_are_refused(llamafactory, name):
    s = scenario.load(name)
    assert s.arch.num_key_value_heads == 8 and s.sequence_parallel in (16, 64)
    reason = llamafactory.check(s, H100x8, _env())
    assert reason is not None
    assert f"sequence_parallel {s.sequence_parallel} with 8 KV heads" in reason and "replicat" in reason


def test_kv_heads_divisible_by_sp_pass(llamafactory):
    for name in ("llama2_70b_128k", "yi34b_256k", "llama2_7b_1m"):  # SP 8 / 8 / 32 vs KV heads 8 / 8 / 32
        s = scenario.load(name)
        assert train_args.v1_kv_head_refusal(s) is None, name
        assert llamafactory.check(s, H100x8, _env()) is None, name


@pytest.mark.slow  # starts a framework's or the host's own process
def test_v1_model_engine_builds_from_config_rank0_in_host_memory_others_on_meta(llamafactory, tmp_path):
    """In the llamafactory env: LLaMA-Factory's own `get_args` + `DistributedInterface`, and
    the worker's model engine on a tiny config (sdpa: the CPU has no flash-attn). Rank 0
    gets random fp32 weights in host memory, any other rank meta tensors; both tagged with
    the init mode LLaMA-Factory's FSDP2 plugin reads. No weight file exists to load."""
    import subprocess

    from fbench_fixtures import backend_env_or_skip
    env = backend_env_or_skip("llamafactory")
    from framework_bench.run import pipeline
    from framework_bench.run.dry_run import unpacked
    s = helpers.tiny(name="tiny_v1", sequence_parallel=2, cluster={"device": "cpu", "gpus_per_node": 2})
    data = unpacked(s, tmp_path)  # the real tokenizer files, no packed rows
    job = pipeline.make_job("llamafactory", s, data, tmp_path)
    job.write()
    plan = llamafactory.plan(job, _env())
    model_dir = plan.files["model_dir"]
    args = json.loads(plan.files["train_args"].read_text())
    args["flash_attn"] = "sdpa"
    args["dist_config"] = None  # one process: no device mesh
    probe = """
import json, sys
import torch
from llamafactory.v1.accelerator.interface import DistributedInterface
from llamafactory.v1.config import get_args
from fbench_llamafactory.worker_v1 import config_model_engine
model_args, *_ = get_args(json.loads(sys.argv[1]))
DistributedInterface(None)
out = {}
for rank in (0, 1):
    DistributedInterface.get_rank = lambda self, dim=None, rank=rank: rank
    model = config_model_engine()(model_args, is_train=True).model
    devices = sorted({p.device.type for p in model.parameters()})
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    std = float(model.model.layers[0].mlp.up_proj.weight.std()) if devices == ["cpu"] else None
    out[rank] = [devices, dtypes, model._init_mode, std]
print(json.dumps(out))
"""
    proc = subprocess.run([str(env.python), "-c", probe, json.dumps(args)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["0"][:3] == [["cpu"], ["torch.float32"], "init_on_rank0"]
    assert 0.01 < out["0"][3] < 0.04  # random init (initializer_range 0.02), not zeros or garbage
    assert out["1"][:3] == [["meta"], ["torch.float32"], "init_on_rank0"]
    assert not [p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin")]
