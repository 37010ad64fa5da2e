"""LoRA and QLoRA on the LLaMA-Factory backend: its own arguments (`finetuning_type:
lora`, `quantization_bit: 4`, ...) generated from the scenario, accepted by its parser, the
refusals, and a real LoRA run whose ledger the live peft model fills."""

from __future__ import annotations

import json
import subprocess

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8
from fbench_fixtures import backend_env_or_skip

from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario

TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@pytest.fixture(scope="module")
def llamafactory():
    return plugins.get("llamafactory")


def ready_env(flavour: str, *extra: str):
    return helpers.ready_env("llamafactory", {"llamafactory": "0.9.5", "transformers": "5.6.0"}, flavour, *extra)


def planned(llamafactory, tmp_path, scn, env, settings_mode="matched") -> tuple[dict, dict]:
    """(run_exp arguments, the model folder's config.json) of the plan for `scn`."""
    job = helpers.make_job("llamafactory", tmp_path, scn).model_copy(update={"settings_mode": settings_mode})
    plan = llamafactory.plan(job, env)
    return (json.loads(plan.files["train_args"].read_text()),
            json.loads((job.run_dir / "model" / "config.json").read_text()))


def test_lora_arguments(llamafactory, tmp_path):
    scn = scenario.load("tiny_cpu_lora")
    assert llamafactory.check(scn, CPU, ready_env("cpu")) is None
    args, config = planned(llamafactory, tmp_path / "matched", scn, ready_env("cpu"))
    assert {k: args[k] for k in ("finetuning_type", "train_from_scratch", "lora_rank", "lora_alpha", "lora_dropout",
                                 "lora_target", "use_rslora", "use_dora", "disable_gradient_checkpointing")} == {
        "finetuning_type": "lora", "train_from_scratch": True, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0,
        "lora_target": TARGETS, "use_rslora": False, "use_dora": False, "disable_gradient_checkpointing": True}
    assert not any(k.startswith("quantization") for k in args)
    assert config["dtype"] == "float32"  # the frozen base is built in the scenario's base dtype
    # native: LLaMA-Factory's own defaults (rank 8, alpha 2 x rank, all linear modules), named in the notes
    native, _ = planned(llamafactory, tmp_path / "native", scn, ready_env("cpu"), "native")
    assert native["finetuning_type"] == "lora" and not any(k.startswith(("lora_", "use_")) for k in native)
    bf16_base, config = planned(llamafactory, tmp_path / "bf16", scenario.load("llama2_7b_8k_1gpu_lora"),
                                ready_env("cuda", "deepspeed"))
    assert config["dtype"] == "bfloat16" and bf16_base["lora_rank"] == 64 and bf16_base["lora_alpha"] == 16.0


def test_qlora_arguments(llamafactory, tmp_path):
    scn = scenario.load("llama2_7b_8k_1gpu_qlora")  # nf4, double quant, bf16 compute
    env = ready_env("cuda", "deepspeed")
    assert llamafactory.check(scn, H100x8, env) is None
    args, config = planned(llamafactory, tmp_path, scn, env)
    assert {k: args[k] for k in ("finetuning_type", "quantization_bit", "quantization_method", "quantization_type",
                                 "double_quantization", "bf16", "lora_rank")} == {
        "finetuning_type": "lora", "quantization_bit": 4, "quantization_method": "bnb", "quantization_type": "nf4",
        "double_quantization": True, "bf16": True, "lora_rank": 64}
    # LLaMA-Factory quantizes only in from_pretrained: the worker hands it the random base
    assert args["train_from_scratch"] is False and config["dtype"] == "bfloat16"


def test_adapter_refusals(llamafactory):
    env = ready_env("cuda", "deepspeed", "flash-attn")
    qlora = scenario.load("llama2_7b_8k_1gpu_qlora")
    fp32 = qlora.model_copy(update={"precision": "fp32", "finetune": qlora.finetune.model_copy(
        update={"compute_dtype": "fp32"})})
    assert "compute dtype fp32" in llamafactory.check(fp32, H100x8, env)
    assert "ZeRO-3" in llamafactory.check(qlora.model_copy(update={"zero_stage": 3}), H100x8, env)
    lora_sp = scenario.load("llama2_7b_8k_1gpu_lora").model_copy(
        update={"sequence_parallel": 2, "cluster": scenario.Cluster(gpus_per_node=2)})
    assert "v1 trainer" in llamafactory.check(lora_sp, H100x8, env)


@pytest.mark.slow  # starts a framework's or the host's own process
def test_adapter_arguments_parse_with_llamafactory(llamafactory, tmp_path):
    """LLaMA-Factory's own parser takes the QLoRA and native LoRA plans (QLoRA trains on CUDA only)."""
    env = backend_env_or_skip("llamafactory")
    qlora, _ = planned(llamafactory, tmp_path / "q", scenario.load("llama3_8b_2k_1gpu_qlora"), ready_env("cuda"))
    native, _ = planned(llamafactory, tmp_path / "n", scenario.load("tiny_cpu_lora"), ready_env("cpu"), "native")
    files = [tmp_path / "qlora.json", tmp_path / "native.json"]
    qlora["use_cpu"] = True  # without a GPU the parser takes bf16 only when told it runs on CPU
    for f, args in zip(files, (qlora, native)):
        f.write_text(json.dumps(args))
    probe = ("import json, sys; from llamafactory.hparams import get_train_args\n"
             "for f in sys.argv[1:]:\n"
             "    m, d, t, ft, g = get_train_args(json.load(open(f)))\n"
             "    print('parsed', json.dumps([ft.finetuning_type, ft.lora_rank, ft.lora_alpha, ft.lora_dropout,"
             " ft.lora_target, m.quantization_bit, str(m.quantization_method), m.quantization_type,"
             " m.double_quantization]))")
    out = subprocess.run([str(env.python), "-c", probe, *map(str, files)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    q, n = (json.loads(line.removeprefix("parsed ")) for line in out.stdout.splitlines() if line.startswith("parsed "))
    assert q == ["lora", 8, 16, 0.0, ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                 4, "bnb", "nf4", True]
    assert n == ["lora", 8, 16, 0.0, ["all"], None, "bnb", "nf4", True]  # LLaMA-Factory's defaults


# The real tiny_cpu_lora run is tests/test_lora.py's compare (every backend with the reference).
