"""LoRA and QLoRA through XTuner's own `SupervisedFinetune(lora=...)`: the generated config in
both settings modes, and a real tiny LoRA run whose settings ledger is read from the live model."""

from __future__ import annotations

import ast

import pytest

import backend_helpers as helpers
from backend_helpers import CPU, H100x8
from fbench_fixtures import backend_env_or_skip
from test_backend_xtuner import call_kwargs, make_job, ready_env, top_level

from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario

LLAMA_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def xtuner():
    return plugins.get("xtuner")


def model_config(xtuner, tmp_path, name: str, mode: str) -> dict:
    scn = scenario.load(name)
    job = make_job(tmp_path / mode, scn).model_copy(update={"settings_mode": mode})
    env = ready_env(scn.cluster.device)
    assert xtuner.check(scn, H100x8 if scn.cluster.device == "cuda" else CPU, env) is None
    return call_kwargs(top_level(xtuner.plan(job, env).files["mmengine_config"])["model"])


def literals(node: ast.expr) -> dict:
    return {k: ast.literal_eval(v) for k, v in call_kwargs(node).items() if k != "type"}


def test_lora_config_in_both_modes(xtuner, tmp_path):
    """matched: the scenario's adapters, frozen weights back in its base dtype; native: XTuner's
    configs' LoRA (no targets: XTuner's find_all_linear_names picks them) and its fp32 upcast."""
    matched = model_config(xtuner, tmp_path, "llama2_7b_8k_1gpu_lora", "matched")
    assert matched["type"].id == "build_adapted" and ast.literal_eval(matched["frozen_dtype"]) == "bfloat16"
    lora = literals(matched["lora"])
    assert lora == {"r": 64, "lora_alpha": 16.0, "lora_dropout": 0.0, "target_modules": LLAMA_LINEARS, "bias": "none",
                    "use_rslora": False, "use_dora": False, "task_type": "CAUSAL_LM"}
    llm = call_kwargs(matched["llm"])
    # built and filled in the base dtype, as the reference fills it (not fp32 as a full matched run)
    assert ast.literal_eval(llm["keep_fp32_weights"]) is False and ast.unparse(llm["torch_dtype"]) == "torch.bfloat16"
    assert "quantization_config" not in llm
    native = model_config(xtuner, tmp_path, "llama2_7b_8k_1gpu_lora", "native")
    assert ast.literal_eval(native["frozen_dtype"]) is None and "torch_dtype" not in call_kwargs(native["llm"])
    assert literals(native["lora"]) == {"r": 64, "lora_alpha": 16, "lora_dropout": 0.1, "bias": "none",
                                        "task_type": "CAUSAL_LM"}


def test_qlora_config_is_xtuners(xtuner, tmp_path):
    """The llm dict of XTuner's llama2_7b_qlora_alpaca_e3.py, with the scenario's quantization."""
    model = model_config(xtuner, tmp_path, "llama2_7b_8k_1gpu_qlora", "matched")
    llm = call_kwargs(model["llm"])
    assert ast.unparse(llm["torch_dtype"]) == "torch.bfloat16"
    assert ast.literal_eval(llm["keep_fp32_weights"]) is False  # the builder keeps the compute dtype it quantizes from
    quant = call_kwargs(llm["quantization_config"])
    assert quant["type"].id == "BitsAndBytesConfig" and ast.unparse(quant["bnb_4bit_compute_dtype"]) == "torch.bfloat16"
    assert {k: ast.literal_eval(quant[k]) for k in ("load_in_4bit", "load_in_8bit", "bnb_4bit_use_double_quant",
                                                     "bnb_4bit_quant_type")} == {
        "load_in_4bit": True, "load_in_8bit": False, "bnb_4bit_use_double_quant": True, "bnb_4bit_quant_type": "nf4"}
    assert ast.literal_eval(model["frozen_dtype"]) == "bfloat16"


def test_adapters_under_zero3_are_refused(xtuner):
    lora = {"method": "lora", "rank": 8, "alpha": 16.0, "targets": "all-linear"}
    scn = helpers.tiny(cluster={"device": "cpu", "gpus_per_node": 2}, zero_stage=3, finetune=lora)
    assert "ZeRO stage 3" in xtuner.check(scn, CPU, ready_env("cpu", "deepspeed"))
    assert xtuner.check(scn.model_copy(update={"zero_stage": 2}), CPU, ready_env("cpu", "deepspeed")) is None


QLORA_PROBE = """
import json, sys, torch
torch.cpu.is_bf16_supported = lambda *a, **k: False  # as the worker does
# bitsandbytes 0.45 has no CPU backend: its environment check refuses here (on CUDA it runs)
from transformers.quantizers.quantizer_bnb_4bit import Bnb4BitHfQuantizer
Bnb4BitHfQuantizer.validate_environment = lambda self, *a, **k: None
from mmengine.config import Config
from mmengine.registry import MODELS
from framework_bench.worker import settings
llm = MODELS.build(Config.fromfile(sys.argv[1]).model).llm  # as mmengine's Runner builds it
base = llm.get_base_model()
layer = base.model.layers[0].mlp.down_proj
print(json.dumps({"lora_layer": type(layer).__module__ + "." + type(layer).__name__,
                  "base_layer": type(layer.base_layer).__name__, "loaded_in_4bit": llm.is_loaded_in_4bit,
                  "quant_type": layer.base_layer.weight.quant_type, "double_quant": layer.base_layer.weight.compress_statistics,
                  "head": type(base.lm_head).__name__, "on_meta": sum(p.is_meta for p in llm.parameters()),
                  **settings.model_settings(llm)}))
"""


@pytest.mark.slow
def test_qlora_config_builds_the_4bit_model_xtuner_loads(xtuner, tmp_path):
    """QLoRA needs CUDA to quantize, but the generated config's model is built here as mmengine
    builds it: the builder swaps every linear but the head for bitsandbytes' 4-bit one and marks
    the model loaded in 4 bits, so XTuner's `_prepare_for_lora` and peft take the QLoRA path
    (peft's 4-bit LoRA layers), checkpointing as the scenario asks with a readable reentrant flag."""
    import json
    import subprocess

    env = backend_env_or_skip("xtuner")
    scn = scenario.load("tiny_cpu_qlora").model_copy(update={"activation_checkpointing": True})
    config = xtuner.plan(make_job(tmp_path, scn), env).files["mmengine_config"]
    out = subprocess.run([str(env.python), "-c", QLORA_PROBE, str(config)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    built = json.loads(out.stdout.strip().splitlines()[-1])
    assert built["lora_layer"] == "peft.tuners.lora.bnb.Linear4bit" and built["base_layer"] == "Linear4bit"
    assert built["loaded_in_4bit"] is True and built["head"] == "Linear"
    assert built["on_meta"] == 0  # every 4-bit weight holds a filled one
    assert (built["quant_type"], built["double_quant"]) == ("nf4", True)
    assert built["activation_checkpointing"] is True and built["checkpointing_reentrant"] is True


# The real tiny_cpu_lora runs, in both modes, are tests/test_lora.py's compares (one per mode,
# every backend with the reference): each run is the most expensive thing a test builds.
