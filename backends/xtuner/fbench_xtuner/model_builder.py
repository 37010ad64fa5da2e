"""The `llm` builder the generated config names (runs in the XTuner env).

SupervisedFinetune reads `pretrained_model_name_or_path` from its `llm` dict and may add
`torch_dtype`/`attn_implementation` (flash-attn present) before building it, so the
builder takes those keyword arguments, but builds random weights from the config alone:
the benchmark needs the architecture, not a checkpoint (and no hub is reachable).

Where the weights are made: on a GPU run they are initialised directly on this rank's GPU
(the process group, hence the current device, is set up before the model is built), not in
fp32 on the CPU and copied over: for a 7B model that is seconds instead of minutes. Under
ZeRO-3 transformers builds them inside DeepSpeed's `zero.Init` (XTuner's strategy registers
the DeepSpeed config first), already partitioned, so that path is left to it.

Then every parameter is overwritten with the compare's initial weights (`init_seed`: the
SDK's `initial_weights_worker.fill`), before XTuner's model, mmengine's wrapper or DeepSpeed see it.

LoRA/QLoRA runs build the model through `build_adapted` (XTuner's own `SupervisedFinetune(lora=...)`
followed by what fbench needs once peft's adapters exist), and a QLoRA `llm` dict carries XTuner's
`quantization_config`, which the builder applies to the filled weights (`quantize`).
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from framework_bench.worker import initial_weights_worker, update


def build_random_llm(pretrained_model_name_or_path: str, init_seed: int, trust_remote_code: bool = False,
                     keep_fp32_weights: bool = False, quantization_config=None, **kwargs):
    model = _from_config(pretrained_model_name_or_path, trust_remote_code, keep_fp32_weights, **kwargs)
    initial_weights_worker.fill(model, init_seed, model.config.to_dict())
    if quantization_config is not None:
        quantize(model, quantization_config)
    return model


def quantize(model, quantization_config) -> None:
    """QLoRA's 4-bit base, made as XTuner's QLoRA configs make it: they load the checkpoint with
    `from_pretrained(..., quantization_config=BitsAndBytesConfig(...))`, which a model built from
    its config never passes through (`from_config` takes no quantization_config). So the steps of
    transformers 4.48's loader are taken here on the filled weights: its bitsandbytes quantizer
    swaps every linear but the LM head for a 4-bit one, each weight is quantized into it as it
    moves to this device (a CUDA one: bitsandbytes 0.45 quantizes on CUDA only, and the quantizer
    refuses without), and the model is marked loaded in 4 bits, so XTuner's `_prepare_for_lora`
    and peft treat it exactly as a loaded QLoRA model. ZeRO-3's partitioned weights are not
    handled (the plugin refuses QLoRA with ZeRO-3)."""
    from transformers.quantizers import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization_config, pre_quantized=False)
    device = next(model.parameters()).device
    device_map = {"": device}
    quantizer.validate_environment(torch_dtype=model.dtype, device_map=device_map)
    model.config._pre_quantization_dtype = model.dtype
    filled = dict(model.named_parameters())
    quantizer.preprocess_model(model=model, device_map=device_map, keep_in_fp32_modules=[])
    for name in list(filled):
        value = filled.pop(name)  # dropped once quantized: the 16-bit copy is never whole beside the 4-bit one
        if quantizer.check_quantized_param(model, value, name, {}):
            quantizer.create_quantized_param(model, value.data, name, device, {})
    quantizer.postprocess_model(model, config=model.config)
    model.hf_quantizer = quantizer


class _Adapters:
    """A model seen by `initial_weights_worker.fill` (it reads `named_parameters` only) as its
    LoRA adapters alone: the base was filled before peft wrapped it, and a 4-bit base could not
    be written again."""

    def __init__(self, model):
        self.model = model

    def named_parameters(self):
        return [(name, p) for name, p in self.model.named_parameters() if update.is_adapter(name)]


def build_adapted(init_seed: int, frozen_dtype: str | None = None, **kwargs):
    """XTuner's `SupervisedFinetune(**kwargs)` (its `lora` dict included), as its LoRA configs
    build it, then peft's new adapters filled with the compare's initial weights (A from the
    seed, B zero) before mmengine's optimizer or DeepSpeed see them.

    XTuner's `_prepare_for_lora` calls peft's `prepare_model_for_kbit_training` also without
    quantization: it freezes the base and upcasts every fp16/bf16 parameter to fp32 (4-bit ones
    excepted). `frozen_dtype` (matched settings) casts the frozen parameters back to the
    scenario's dtype they were built in (lora: its base_dtype; qlora: its compute dtype, for what
    is not 4-bit), exactly, as the torch reference builds them and LLaMA-Factory keeps them (it
    upcasts only what trains). Native settings keep XTuner's upcast (the ledger's base_dtype shows it)."""
    from xtuner.model import SupervisedFinetune

    model = SupervisedFinetune(**kwargs)
    if kwargs.get("use_activation_checkpointing"):
        # With a 4-bit base, peft's prepare_model_for_kbit_training enables checkpointing again
        # without use_reentrant, which torch runs reentrant with a warning and the ledger cannot
        # read: named explicitly, as SupervisedFinetune's own call leaves it (transformers 4.48's
        # default, XTuner's full runs' and LLaMA-Factory's). Off when the scenario says so: then
        # neither XTuner nor peft enables it.
        model.llm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    if frozen_dtype is not None:
        dtype = getattr(torch, frozen_dtype)
        for p in model.llm.parameters():
            if not p.requires_grad and p.is_floating_point():
                p.data = p.data.to(dtype)
    initial_weights_worker.fill(_Adapters(model.llm), init_seed, model.llm.config.to_dict())
    return model


def _from_config(pretrained_model_name_or_path: str, trust_remote_code: bool, keep_fp32_weights: bool, **kwargs):
    """`keep_fp32_weights` (matched settings): ignore the bf16 `torch_dtype` XTuner adds when it
    picks flash-attn, so the weights stay fp32 under bf16 autocast as on the other backend."""
    if keep_fp32_weights:
        kwargs.pop("torch_dtype", None)
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=trust_remote_code)
    if torch.cuda.is_available() and not is_deepspeed_zero3_enabled():
        with torch.device("cuda", torch.cuda.current_device()):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
    return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
