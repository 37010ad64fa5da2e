"""The TRL backend: discovery, refusals, the SFTConfig and DeepSpeed JSON it plans for published
scenarios, TRL's own argument class accepting them, and a real run of its SFTTrainer (LoRA runs in
tests/test_lora.py, beside the other frameworks)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8, tiny
from fbench_fixtures import backend_env_or_skip

from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import BackendEnv
from framework_bench.scenario import scenario


@pytest.fixture(scope="module")
def trl():
    return plugins.get("trl")


def ready_env(flavour: str, *extra: str, **pinned: str) -> BackendEnv:
    """The trl env, `pinned` distributions at their versions (`accelerate="1.12.0"`)."""
    return helpers.ready_env("trl", {"trl": "1.16.0", "transformers": "5.6.0", **pinned}, flavour, *extra)


def planned(trl, tmp_path, scn, env, settings_mode="matched"):
    """(the plan, its run file: {"sft_config", "attn_implementation"}) for `scn`."""
    job = helpers.make_job("trl", tmp_path, scn).model_copy(update={"settings_mode": settings_mode})
    plan = trl.plan(job, env)
    return plan, json.loads(plan.files["run"].read_text())


def test_discovered_through_entry_point(trl):
    info = trl.info
    assert info.name == "trl" and info.framework == "TRL" and info.env.framework_package == "trl"
    caps = info.capabilities
    assert caps.lora and caps.sequence_parallel and not caps.qlora and not caps.varlen
    for flavour, path in info.env.requirements.items():
        lines = path.read_text().splitlines()
        assert {"torch==2.13.0", "trl==1.16.0", "transformers==5.6.0"} <= set(lines), flavour
    # the same DeepSpeed as every other env where it is installed (the GPU flavour)
    assert "deepspeed==0.18.4" in info.env.requirements["cuda"].read_text().splitlines()


def test_refusals_name_the_reason(trl):
    assert trl.check(tiny(), CPU, ready_env("cpu")) is None
    zero_refused = trl.check(tiny(zero_stage=2, cluster={"device": "cpu", "gpus_per_node": 2}), CPU, ready_env("cpu"))
    assert "no deepspeed" in zero_refused and "`--backends trl@deepspeed==0.18.6`" in zero_refused
    assert "max_steps" in trl.check(tiny(steps={"warmup": 1, "measured": 2, "unit": "micro"}), CPU, ready_env("cpu"))
    gpu_8k = scenario.load("llama2_7b_8k")
    assert "has none" in trl.check(gpu_8k, CPU, ready_env("cuda", "deepspeed"))
    assert trl.check(gpu_8k, H100x8, ready_env("cuda", "deepspeed")) is None
    # what it does not declare the host refuses before asking: varlen, QLoRA
    caps = trl.info.capabilities
    assert "varlen" in caps.refusal(tiny(attention="varlen"), "trl")
    assert "QLoRA" in caps.refusal(scenario.load("llama2_7b_8k_1gpu_qlora"), "trl")


def test_sequence_parallel_refusals_name_the_layer_the_stage_and_the_row_order(trl):
    """TRL's sequence parallel is accelerate's (from 1.12) around DeepSpeed's Ulysses: the trl env
    (accelerate 1.11) names the layer that runs it; in that layer it needs a ZeRO stage, and SP
    over every process (beside data parallel each step's rows would not be the scenario's)."""
    sp_layer, base = ready_env("cuda", "deepspeed", accelerate="1.12.0"), ready_env("cuda", "deepspeed", accelerate="1.11.0")
    sp8 = scenario.load("llama2_7b_128k")
    assert (sp8.sequence_parallel, sp8.cluster.gpus, sp8.zero_stage) == (8, 8, 3)
    refused = trl.check(sp8, H100x8, base)
    assert "accelerate 1.11.0" in refused and "`--backends trl@accelerate==1.12.0@deepspeed==0.18.6`" in refused
    assert trl.check(sp8, H100x8, sp_layer) is None
    assert "give a ZeRO stage" in trl.check(sp8.model_copy(update={"zero_stage": 0}), H100x8, sp_layer)
    sp4_of_32 = scenario.load("llama2_70b_32k")
    assert (sp4_of_32.sequence_parallel, sp4_of_32.cluster.gpus) == (4, 32)
    assert "another order than the scenario's" in trl.check(sp4_of_32, H100x8, sp_layer)


def test_sequence_parallel_plan_hands_accelerate_its_parallelism_config(trl, tmp_path):
    env = ready_env("cuda", "deepspeed", accelerate="1.12.0")
    _, run = planned(trl, tmp_path, scenario.load("llama2_7b_128k"), env)
    assert run["parallelism_config"] == {"sp_backend": "deepspeed", "sp_size": 8, "sp_handler": {
        "sp_seq_length": 131072, "sp_seq_length_is_variable": False, "sp_attn_implementation": "sdpa"}}
    _, unsplit = planned(trl, tmp_path / "8k", scenario.load("llama2_7b_8k"), env)
    assert unsplit["parallelism_config"] is None


def test_published_llama2_7b_8k_config(trl, tmp_path):
    plan, run = planned(trl, tmp_path, scenario.load("llama2_7b_8k"), ready_env("cuda", "deepspeed"))
    job_dir = tmp_path / "run"
    assert plan.module == "fbench_trl.worker" and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert run == {"attn_implementation": "sdpa", "parallelism_config": None, "sft_config": {
        "output_dir": str(job_dir / "trl_output"), "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1,
        "max_steps": 7, "learning_rate": 2e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "weight_decay": 0.0,
        "max_grad_norm": 1.0, "lr_scheduler_type": "constant", "warmup_steps": 0, "bf16": True, "fp16": False,
        "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "dataset_kwargs": {"skip_prepare_dataset": True}, "packing": False, "padding_free": False,
        "max_length": 8192, "train_sampling_strategy": "sequential", "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "optim": "adamw_torch_fused", "ddp_find_unused_parameters": False,
        "dataloader_num_workers": 4, "dataloader_pin_memory": False, "seed": 1024,
        "deepspeed": str(job_dir / "deepspeed_config.json")}}
    ds = json.loads(plan.files["deepspeed"].read_text())
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True} and ds["train_batch_size"] == 8
    _, with_fa2 = planned(trl, tmp_path / "fa2", scenario.load("llama2_7b_8k"), ready_env("cuda", "deepspeed", "flash-attn"))
    assert with_fa2["attn_implementation"] == "flash_attention_2"


def test_native_settings_are_sftconfig_defaults(trl, tmp_path):
    _, run = planned(trl, tmp_path, scenario.load("tiny_cpu"), ready_env("cpu"), "native")
    config = run["sft_config"]
    assert config["seed"] == 42 and not {"optim", "ddp_find_unused_parameters", "dataloader_num_workers"} & set(config)
    # the scenario's own axes stay in both modes: its checkpointing and precision, not SFTConfig's defaults (both on)
    assert config["gradient_checkpointing"] is False and config["bf16"] is False


@pytest.mark.slow  # starts the trl env's Python
def test_trl_accepts_the_planned_config(trl, tmp_path):
    """SFTConfig (TRL's own argument class) takes the published plan as written (`use_cpu` only
    because transformers refuses a bf16 plan on a machine without a GPU)."""
    env = backend_env_or_skip("trl")
    plan, _ = planned(trl, tmp_path, scenario.load("llama2_7b_8k_1gpu"), ready_env("cuda", "deepspeed"))
    probe = ("import json, sys; from trl import SFTConfig; c = SFTConfig(**json.load(open(sys.argv[1]))['sft_config'], use_cpu=True); "
             "print(json.dumps([c.train_sampling_strategy, c.dataset_kwargs, c.gradient_checkpointing, c.max_steps]))")
    out = subprocess.run([str(env.python), "-c", probe, str(plan.files["run"])], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["sequential", {"skip_prepare_dataset": True}, True, 7]


@pytest.mark.slow
def test_tiny_cpu_trains_with_trl(tiny_cpu_run, tmp_path):
    scn, result = helpers.train_tiny_cpu("trl", tmp_path, "1.16.0", shared=tiny_cpu_run)
    assert result.settings["trainer"] == "hf-trainer" and result.settings["optimizer_impl"] == "for-loop"
    assert result.settings["loss_normalization"].startswith("token sum over the step's labels")
    worker = json.loads((result.run_dir / "worker.json").read_text())
    assert worker["rows_converted"] == scn.rows_needed and worker["param_dtype"] == "float32"
    # one process, no ZeRO: it held the whole model once built
    assert worker["built"]["elements_held"] == worker["built"]["elements_whole"] == worker["param_count"]
    assert worker["built"]["peak_bytes"] > 0


SP_LAYER = "trl@accelerate==1.12.0@deepspeed==0.18.6"
HALF_ROWS = Path(__file__).parent / "half_rows"  # TRL's SP with the second half of every row untrained


@pytest.mark.slow
def test_sequence_parallel_is_judged_against_the_reference_ulysses_run(home_with_envs, tmp_path, monkeypatch):
    """TRL's sequence parallel (accelerate's ParallelismConfig, DeepSpeed's Ulysses) at SP 2 under
    ZeRO-3 on two CPU processes, in a round against the reference's Ulysses run: the model built
    partitioned, each rank trains half of every row, both record the group's rows whole, the
    settings say SP 2 around SDPA, and loss and update agree at every step. The same run training only the first half of each row
    (`half_rows/`) records the same whole rows and fails parity: `invalid`."""
    from framework_bench.envs import venvs
    from framework_bench.envs.creation import create_backend

    backend_env_or_skip("trl"), backend_env_or_skip("torch")
    layered = plugins.get(SP_LAYER)
    if not venvs.inspect(SP_LAYER, layered.info.env).ready:
        create_backend(layered, say=lambda msg: None)
    s = scenario.load("multiproc_tiny_cpu_sp2")
    s = s.model_copy(update={"steps": s.steps.model_copy(update={"measured": 3})})
    honest, half = helpers.sequence_parallel_round(s, SP_LAYER, HALF_ROWS, tmp_path, monkeypatch)
    assert helpers.passed_but_for_load(honest), honest.reason
    judged = {c.name: c for c in honest.checks}
    assert judged["parity"].status == judged["update_parity"].status == "pass" and "every step judged" in judged["parity"].detail
    parity = {c.name: c for c in half.checks}["parity"]
    assert half.status == "invalid" and parity.status == "fail", half.reason
    print(f"\nhonest: {judged['parity'].detail}\nhonest update: {judged['update_parity'].detail}"
          f"\nhalf rows: {parity.detail}")  # docs/calibration.md
