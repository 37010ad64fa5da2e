"""The LLaMA-Factory backend: discovery, refusals, the generated arguments and DeepSpeed
JSON for published scenarios, its own throughput log, and a real run of its trainer."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8, tiny
from fbench_fixtures import backend_env_or_skip

from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import BackendEnv, Job

from fbench_llamafactory import plugin as lf_plugin

@pytest.fixture(scope="module")
def llamafactory():
    return plugins.get("llamafactory")


def ready_env(flavour: str, *extra: str) -> BackendEnv:
    return helpers.ready_env("llamafactory", {"llamafactory": "0.9.5", "transformers": "5.6.0"}, flavour, *extra)


def make_job(tmp_path: Path, scn: scenario.Scenario) -> Job:
    return helpers.make_job("llamafactory", tmp_path, scn)


def test_discovered_through_entry_point(llamafactory):
    info = llamafactory.info
    assert info.name == "llamafactory" and info.framework == "LLaMA-Factory"
    assert info.capabilities.sequence_parallel and info.capabilities.zero_stages == [0, 1, 2, 3]
    assert info.env.framework_package == "llamafactory"
    assert info.env.post_install == ["fbench_llamafactory.env_fixups", "framework_bench.plugins.deepspeed_jit"]
    for flavour, path in info.env.requirements.items():
        lines = path.read_text().splitlines()
        assert "torch==2.13.0" in lines and "llamafactory==0.9.5" in lines, flavour
    assert "deepspeed==" in info.env.requirements["cuda"].read_text()


def test_sequence_parallel_on_cpu_is_unsupported(llamafactory):
    scn = tiny(sequence_parallel=2, cluster={"device": "cpu", "gpus_per_node": 2})
    reason = llamafactory.check(scn, CPU, ready_env("cpu"))
    assert reason and "v1 trainer" in reason and "GPU" in reason and "flash-attn" in reason


def test_sequence_parallel_on_gpu_needs_flash_attn(llamafactory):
    scn = scenario.load("llama2_70b_32k")
    reason = llamafactory.check(scn, H100x8, ready_env("cuda", "deepspeed"))
    assert reason and "flash-attn" in reason and "GPU" not in reason
    assert llamafactory.check(scn, H100x8, ready_env("cuda", "deepspeed", "flash-attn")) is None


def test_other_refusals(llamafactory):
    missing = BackendEnv(name="llamafactory", path=Path("/x"), python=Path("/x/bin/python"), problem="not created")
    assert "not ready" in llamafactory.check(tiny(), CPU, missing)
    assert "flash-attn" in llamafactory.check(tiny(attention="varlen"), CPU, ready_env("cpu"))
    gpu_8k = scenario.load("llama2_7b_8k")
    assert "has none" in llamafactory.check(gpu_8k, CPU, ready_env("cuda", "deepspeed"))
    assert "deepspeed" in llamafactory.check(gpu_8k, H100x8, ready_env("cuda"))
    # ZeRO on CPU runs through DeepSpeed's CPU accelerator (multiproc_tiny_cpu_zero2/3); it needs deepspeed
    assert "needs deepspeed" in llamafactory.check(tiny(zero_stage=2), CPU, ready_env("cpu"))
    assert llamafactory.check(tiny(zero_stage=2, cluster={"device": "cpu", "gpus_per_node": 2}), CPU,
                              ready_env("cpu", "deepspeed")) is None
    assert llamafactory.check(tiny(), CPU, ready_env("cpu")) is None


def test_published_llama2_7b_8k_arguments(llamafactory, tmp_path, monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    scn = scenario.load("llama2_7b_8k")
    job = make_job(tmp_path, scn)
    env = ready_env("cuda", "deepspeed")
    assert llamafactory.check(scn, H100x8, env) is None
    plan = llamafactory.plan(job, env)
    assert plan.module == "fbench_llamafactory.worker" and plan.args == [str(job.job_file)]
    # 8 processes: torchrun sets the ranks; the plan pins the GPUs, the allocator and the env's JIT-ops cache
    assert plan.python == env.python and plan.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                                                      "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                                      "TORCH_EXTENSIONS_DIR": str(env.path / "torch_extensions")}
    args = json.loads(plan.files["train_args"].read_text())
    run = job.run_dir
    assert args == {
        "stage": "sft", "do_train": True, "finetuning_type": "full", "train_from_scratch": True,
        "model_name_or_path": str(run / "model"), "flash_attn": "sdpa", "disable_gradient_checkpointing": False,
        "dataset": "fbench_packed", "template": "default", "tokenized_path": str(run / "tokenized"),
        "cutoff_len": 8192, "packing": True, "neat_packing": False, "disable_shuffling": True,
        "output_dir": str(run / "output"), "overwrite_output_dir": True,
        "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": 7,
        "learning_rate": 2e-5, "adam_beta1": 0.9, "adam_beta2": 0.999,
        "weight_decay": 0.0, "max_grad_norm": 1.0, "lr_scheduler_type": "constant", "warmup_steps": 0,
        "bf16": True, "logging_steps": 1, "save_strategy": "no", "report_to": "none",
        # matched settings (the default): aligned with the XTuner backend; no token-count sync
        "optim": "adamw_torch_fused", "ddp_find_unused_parameters": False, "dataloader_num_workers": 4,
        "dataloader_pin_memory": False, "seed": 1024,
        "deepspeed": str(run / "deepspeed.json"),
    }
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["max_position_embeddings"] == 8192 and config["hidden_size"] == 4096
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in (run / "model").iterdir()}
    assert not list((run / "model").glob("*.safetensors"))  # random init: no weights
    with_fa2 = llamafactory.plan(job, ready_env("cuda", "deepspeed", "flash-attn"))
    assert json.loads(with_fa2.files["train_args"].read_text())["flash_attn"] == "fa2"


def test_deepspeed_json_for_zero3(llamafactory, tmp_path):
    job = make_job(tmp_path, scenario.load("llama2_7b_8k"))
    plan = llamafactory.plan(job, ready_env("cuda", "deepspeed"))
    ds = json.loads(plan.files["deepspeed"].read_text())
    assert ds["zero_optimization"]["stage"] == 3
    assert ds["train_micro_batch_size_per_gpu"] == 1 and ds["gradient_accumulation_steps"] == 1
    assert ds["train_batch_size"] == 8 and ds["gradient_clipping"] == 1.0
    assert ds["bf16"] == {"enabled": True} and ds["fp16"] == {"enabled": False}
    # matched: XTuner's deepspeed_zero3.json, DeepSpeed's defaults for every bucket / prefetch size
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True}


def test_native_settings_follow_llamafactory_examples(llamafactory, tmp_path):
    scn = scenario.load("llama2_7b_8k")
    job = make_job(tmp_path, scn).model_copy(update={"settings_mode": "native"})
    plan = llamafactory.plan(job, ready_env("cuda", "deepspeed"))
    args = json.loads(plan.files["train_args"].read_text())
    assert "optim" not in args and "ddp_find_unused_parameters" not in args  # transformers' defaults
    assert args["seed"] == 42 and args["dataloader_num_workers"] == 4
    assert "include_num_input_tokens_seen" not in args
    zero = json.loads(plan.files["deepspeed"].read_text())["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == "auto" and zero["overlap_comm"] is False


def test_zero_on_one_process_becomes_a_world_of_one(llamafactory, tmp_path):
    scn = scenario.load("llama2_7b_8k").model_copy(update={"cluster": scenario.Cluster(gpus_per_node=1)})
    plan = llamafactory.plan(make_job(tmp_path, scn), ready_env("cuda", "deepspeed"))
    assert plan.env["WORLD_SIZE"] == "1" and plan.env["LOCAL_RANK"] == "0" and int(plan.env["MASTER_PORT"]) > 0


def test_sequence_parallel_plans_the_v1_trainer(llamafactory, tmp_path):
    scn = scenario.load("llama2_70b_32k")  # 4 nodes x 8 GPUs, SP 4, grad accum 4, ZeRO 3
    job = make_job(tmp_path, scn)
    plan = llamafactory.plan(job, ready_env("cuda", "deepspeed", "flash-attn"))
    assert plan.files["train_args"].name == "llamafactory_v1_train.json" and "deepspeed" not in plan.files
    args = json.loads(plan.files["train_args"].read_text())
    assert args["dist_config"] == {"name": "fsdp2", "cp_size": 4, "cp_mode": "ulysses", "reshard_after_forward": True}
    assert args["flash_attn"] == "flash_attention_2"
    assert args["micro_batch_size"] == 1 and args["global_batch_size"] == 1 * 4 * 8  # DP = 32 / SP 4
    assert args["cutoff_len"] == 32768 and args["max_steps"] == 7 and args["bf16"] is True
    assert args["enable_activation_checkpointing"] is True
    assert args["train_dataset"] == str(job.run_dir / "train.parquet")


def test_framework_throughput_from_the_trainers_runtime(tmp_path):
    job = make_job(tmp_path, tiny(steps={"warmup": 2, "measured": 3}))
    results = job.run_dir / "output" / "train_results.json"
    results.parent.mkdir(parents=True)
    results.write_text(json.dumps({"train_runtime": 10.0, "train_samples_per_second": 0.5}))
    figures = lf_plugin.framework_throughput(job)
    assert figures == {"tokens_per_sec_whole_run": 512 * 5 / 10.0, "train_runtime": 10.0}
    # less the seconds fbench's own hook took inside the trainer's runtime (the initial seed's fill)
    assert lf_plugin.framework_throughput(job, 2.0)["tokens_per_sec_whole_run"] == 512 * 5 / 8.0


@pytest.mark.slow  # starts a framework's or the host's own process
def test_v1_arguments_parse_with_llamafactory(llamafactory, tmp_path):
    """LLaMA-Factory's own v1 parser accepts the SP plan (training it needs GPUs and flash-attn)."""
    env = backend_env_or_skip("llamafactory")
    job = make_job(tmp_path, scenario.load("llama2_70b_32k"))
    plan = llamafactory.plan(job, ready_env("cuda", "deepspeed", "flash-attn"))
    probe = ("import json, sys; import fbench_llamafactory.worker_v1; from llamafactory.v1.config import get_args; "
             "m, d, t, _ = get_args(json.load(open(sys.argv[1]))); "
             "print(json.dumps([str(m.flash_attn), dict(t.dist_config), t.global_batch_size, t.max_steps, m.init_config.name]))")
    out = subprocess.run([str(env.python), "-c", probe, str(plan.files["train_args"])], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    flash_attn, dist, global_batch, max_steps, init = json.loads(out.stdout.strip().splitlines()[-1])
    assert flash_attn == "flash_attention_2" and dist["cp_size"] == 4 and dist["cp_mode"] == "ulysses"
    assert init == "init_on_rank0"  # LLaMA-Factory's own plugin name, accepted by its parser
    assert global_batch == 32 and max_steps == 7


@pytest.mark.slow
def test_tiny_cpu_trains_with_llamafactory(llamafactory, tmp_path):
    backend_env_or_skip("llamafactory")
    # native settings, as LLaMA-Factory's examples run (the matched run is in test_compare_real.py)
    scn, result = helpers.train_tiny_cpu("llamafactory", tmp_path, "0.9.5", settings_mode="native")
    assert result.settings["optimizer_impl"] == "fused"  # transformers' default optimizer, read off the optimizer
    assert result.settings["seed"] == 42 and result.settings["pin_memory"] is True
    worker = json.loads((result.run_dir / "worker.json").read_text())
    assert worker["param_dtype"] == "float32" and worker["trainer"].startswith("v0")
    assert worker["rows_converted"] == scn.rows_needed
    assert not list((result.run_dir / "output").glob("*.safetensors"))  # the final save is skipped
