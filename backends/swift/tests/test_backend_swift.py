"""The ms-swift backend: discovery, refusals, the SftArguments and DeepSpeed JSON it plans for
published scenarios, and a real run of its SFT pipeline (SwiftSft), whose SftArguments take the
tiny plan as written (LoRA runs in tests/test_lora.py, beside the other frameworks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8, tiny
from fbench_fixtures import backend_env_or_skip

from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import BackendEnv
from framework_bench.scenario import scenario


@pytest.fixture(scope="module")
def swift():
    return plugins.get("swift")


def ready_env(flavour: str, *extra: str) -> BackendEnv:
    return helpers.ready_env("swift", {"ms-swift": "4.6.0", "transformers": "5.6.0"}, flavour, *extra)


def planned(swift, tmp_path, scn, env, settings_mode="matched"):
    """(the plan, its SftArguments keyword arguments) for `scn`."""
    job = helpers.make_job("swift", tmp_path, scn).model_copy(update={"settings_mode": settings_mode})
    plan = swift.plan(job, env)
    return plan, json.loads(plan.files["run"].read_text())["sft_args"]


def test_discovered_through_entry_point(swift):
    info = swift.info
    assert info.name == "swift" and info.framework == "ms-swift" and info.env.framework_package == "ms-swift"
    caps = info.capabilities
    assert caps.lora and not caps.qlora and caps.sequence_parallel and not caps.varlen
    for flavour, path in info.env.requirements.items():
        lines = path.read_text().splitlines()
        assert {"torch==2.13.0", "ms-swift==4.6.0", "transformers==5.6.0", "trl==0.24.0", "deepspeed==0.18.4"} <= set(lines), flavour


def test_refusals_name_the_reason(swift):
    assert swift.check(tiny(), CPU, ready_env("cpu")) is None
    assert "no deepspeed" in swift.check(tiny(zero_stage=2, cluster={"device": "cpu", "gpus_per_node": 2}), CPU,
                                         ready_env("cpu"))
    assert "max_steps" in swift.check(tiny(steps={"warmup": 1, "measured": 2, "unit": "micro"}), CPU, ready_env("cpu"))
    gpu_8k = scenario.load("llama2_7b_8k")
    assert "has none" in swift.check(gpu_8k, CPU, ready_env("cuda", "deepspeed"))
    assert swift.check(gpu_8k, H100x8, ready_env("cuda", "deepspeed")) is None
    caps = swift.info.capabilities
    assert caps.refusal(scenario.load("llama2_70b_32k"), "swift") is None
    # more ranks than K/V heads for Ulysses: ms-swift's ring attention, on padding-free batches only
    kv2_sp4 = scenario.load("multiproc_tiny_cpu_sp2").model_copy(update={"sequence_parallel": 4})
    assert "ring attention" in swift.check(kv2_sp4.model_copy(update={"zero_stage": 0}), CPU, ready_env("cpu"))
    assert "varlen" in caps.refusal(tiny(attention="varlen"), "swift")
    assert "QLoRA" in caps.refusal(scenario.load("llama2_7b_8k_1gpu_qlora"), "swift")


def test_published_llama2_7b_8k_config(swift, tmp_path):
    plan, args = planned(swift, tmp_path, scenario.load("llama2_7b_8k"), ready_env("cuda", "deepspeed"))
    job_dir = tmp_path / "run"
    assert plan.module == "fbench_swift.worker" and plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    assert args == {
        "model": str(job_dir / "model"), "model_type": "llama", "template": "dummy", "torch_dtype": "float32",
        "attn_impl": "sdpa", "use_hf": True, "check_model": False, "cached_dataset": [str(job_dir / "swift_rows")],
        "max_length": 8192, "truncation_strategy": "delete", "train_dataloader_shuffle": False, "packing": False,
        "padding_free": False, "sequence_parallel_size": 1, "use_logits_to_keep": False, "output_dir": str(job_dir / "swift_output"),
        "add_version": False, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "max_steps": 7,
        "learning_rate": 2e-5, "adam_beta1": 0.9, "adam_beta2": 0.999, "weight_decay": 0.0, "max_grad_norm": 1.0,
        "lr_scheduler_type": "constant", "warmup_steps": 0, "bf16": True, "fp16": False,
        "gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "logging_steps": 1, "save_strategy": "no", "report_to": "none", "tuner_type": "full",
        "optim": "adamw_torch_fused", "ddp_find_unused_parameters": False, "dataloader_num_workers": 4,
        "dataloader_pin_memory": False, "seed": 1024, "deepspeed": str(job_dir / "deepspeed_config.json")}
    ds = json.loads(plan.files["deepspeed"].read_text())
    assert ds["zero_optimization"] == {"stage": 3, "overlap_comm": True} and ds["train_batch_size"] == 8
    config = json.loads((plan.files["model_dir"] / "config.json").read_text())
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    _, with_fa2 = planned(swift, tmp_path / "fa2", scenario.load("llama2_7b_8k"), ready_env("cuda", "deepspeed", "flash-attn"))
    assert with_fa2["attn_impl"] == "flash_attention_2"


def test_lora_matched_is_the_scenarios_native_is_swifts(swift, tmp_path):
    scn = scenario.load("tiny_cpu_lora")
    _, matched = planned(swift, tmp_path / "m", scn, ready_env("cpu"))
    f = scn.finetune
    assert matched["tuner_type"] == "lora" and matched["lora_rank"] == f.rank and matched["lora_alpha"] == f.alpha
    assert matched["optim"] == "adamw_torch" and matched["dataloader_num_workers"] == 0
    _, native = planned(swift, tmp_path / "n", scn, ready_env("cpu"), "native")
    assert native["tuner_type"] == "lora" and not {"lora_rank", "lora_alpha", "target_modules", "optim"} & set(native)
    # the scenario's own axes stay in both modes: its precision, checkpointing and schedule, not ms-swift's defaults
    assert native["seed"] == 42 and native["fp16"] is False and native["gradient_checkpointing"] is False
    assert native["lr_scheduler_type"] == "constant" and native["weight_decay"] == matched["weight_decay"]


@pytest.mark.slow
def test_tiny_cpu_trains_with_swift(tiny_cpu_run, tmp_path):
    scn, result = helpers.train_tiny_cpu("swift", tmp_path, "4.6.0", shared=tiny_cpu_run)
    assert result.settings["trainer"] == "hf-trainer" and result.settings["optimizer_impl"] == "for-loop"
    assert result.settings["loss_normalization"].startswith("token sum over the step's labels")
    worker = json.loads((result.run_dir / "worker.json").read_text())
    assert worker["rows_converted"] == scn.rows_needed and worker["param_dtype"] == "float32"


LABEL_SHIFT = Path(__file__).parent / "label_shift"  # ms-swift with its SP label roll made the HF shift


@pytest.mark.slow
def test_sequence_parallel_is_judged_against_the_reference_trained_with_its_rolled_labels(home_with_envs, tmp_path,
                                                                                          monkeypatch):
    """ms-swift's Ulysses SP 2 under ZeRO-3 on two CPU processes, in a round against the reference's
    Ulysses run: the model built partitioned (zero.Init: rank 0 holds half of it), each rank trains
    half of every row, both read the group's rows, and the settings say SP 2 around SDPA. ms-swift
    rolls each row's labels (a packed row whose first label is supervised trains one more target)
    and claims so: it is judged against the reference trained with its labels rolled, at every
    step and on the update. A run that claims the roll but trains the shift (`label_shift/`) agrees
    at step 1 (a row that starts unsupervised) and not after: `invalid`."""
    import numpy as np

    from framework_bench.data.packing import pack

    backend_env_or_skip("swift"), backend_env_or_skip("torch")
    s = scenario.load("multiproc_tiny_cpu_sp2")
    s = s.model_copy(update={"steps": s.steps.model_copy(update={"measured": 3})})  # ZeRO-3, as the published SP rows
    data = pack(s, progress=False, say=lambda msg: None)
    starts = np.load(data.dir / "labels.npy", mmap_mode="r")[: s.steps.total, 0]
    assert starts[0] == -100 and (starts[1:] != -100).any()  # the rows this test needs: else another scenario
    rolled, shifted = helpers.sequence_parallel_round(s, "swift", LABEL_SHIFT, tmp_path, monkeypatch)
    for r in (rolled, shifted):
        assert r.settings["labels_rolled"] is True
        assert any("judged against a run of torch trained with" in n and "rolled labels" in n for n in r.notes), r.notes
    judged = {c.name: c for c in rolled.checks}
    assert helpers.passed_but_for_load(rolled), rolled.reason
    assert judged["parity"].status == judged["update_parity"].status == "pass", rolled.reason
    assert "every step judged" in judged["parity"].detail
    parity = {c.name: c for c in shifted.checks}["parity"]
    assert shifted.status == "invalid" and parity.status == "fail", shifted.reason
    off = {step: abs(loss - rolled.loss_curve[step]) / rolled.loss_curve[step] for step, loss in shifted.loss_curve.items()}
    assert off[1] < 1e-5 < max(off.values()), off
    print(f"\nrolled: {judged['parity'].detail}\nrolled update: {judged['update_parity'].detail}"
          f"\nshifted: {parity.detail}")  # docs/calibration.md

