"""LoRA adapters, worker side: the peft config a scenario's `finetune` asks for, and what the
live adapted model really holds, for the settings ledger.

Every framework fbench drives adapts through peft (XTuner's `SupervisedFinetune(lora=...)`,
LLaMA-Factory's `finetuning_type: lora`, the torch reference's `get_peft_model`), so one
reader of peft's live modules serves all: `settings(model)` reads the adapted linears
(`lora_A`/`lora_B` per adapter, peft's `LoraLayer`) and the frozen weights they wrap, never
the config a framework was handed. `initial_weights_host.canonical_name` maps peft's
parameter names to HF's, so the shared initial weights cover base and adapters alike.

Stdlib at import; torch is imported inside the functions that need it.
"""

from __future__ import annotations

from framework_bench.worker.job import FineTune
from framework_bench.worker.settings import Value, numel

ADAPTER = "default"  # peft's adapter name, which every framework here keeps
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def lora_config(finetune: FineTune) -> dict:
    """The `peft.LoraConfig` keyword arguments of the scenario's adapters: its targets as one
    explicit list (the LM head never among them), rank, alpha, dropout, no bias, rsLoRA and
    DoRA off."""
    return {"r": finetune.rank, "lora_alpha": finetune.alpha, "lora_dropout": finetune.dropout,
            "target_modules": list(finetune.targets), "bias": "none", "use_rslora": False, "use_dora": False,
            "task_type": "CAUSAL_LM"}


def attach(model, job):
    """`model` wrapped in peft's adapters of the job's scenario (a worker that builds its own
    model: the torch reference). peft keeps fp32 adapters over a 16-bit base (its
    `autocast_adapter_dtype`, as under XTuner and LLaMA-Factory)."""
    import peft

    return peft.get_peft_model(model, peft.LoraConfig(**lora_config(job.scenario.finetune)))


def quantize_base(model, finetune: FineTune, device) -> None:
    """QLoRA: every adapted linear's frozen base becomes a bitsandbytes 4-bit linear holding
    the weights `fill` wrote (quantized when moved to the GPU), as QLoRA stores them; the
    other decoder linears have no adapter here (targets: all linears in every bundled QLoRA
    scenario). bitsandbytes has no CPU kernels in the versions the frameworks pin: the host
    refuses QLoRA on CPU before a worker starts."""
    import bitsandbytes as bnb
    import torch

    compute = getattr(torch, TORCH_DTYPES[finetune.compute_dtype])
    for layer in [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]:
        base = layer.base_layer
        four_bit = bnb.nn.Linear4bit(base.in_features, base.out_features, bias=base.bias is not None,
                                     compute_dtype=compute, compress_statistics=finetune.double_quant,
                                     quant_type=finetune.quant_type, device="cpu")
        four_bit.weight = bnb.nn.Params4bit(base.weight.data.to("cpu", compute), requires_grad=False,
                                            compress_statistics=finetune.double_quant, quant_type=finetune.quant_type)
        layer.base_layer = four_bit.to(device)  # quantized here


def _dtype(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def trainable_count(model) -> int:
    """Parameters that take gradients (ZeRO-3 partitions counted whole)."""
    return sum(numel(p) for p in model.parameters() if p.requires_grad)


def settings(model) -> dict[str, Value]:
    """The fine-tuning method in effect, read from the live model: `trainable_params` always;
    with peft's adapters also the adapted module names (one sorted list, and whether the LM
    head is among them), rank, alpha and the scale it gives, dropout, rsLoRA, DoRA, the frozen
    base weights' dtype (after any framework's upcast) and the adapters' dtype; with 4-bit
    bitsandbytes layers their quant type, double quantization, compute and storage dtype."""
    adapted = {name: m for name, m in model.named_modules() if hasattr(m, "lora_A") and ADAPTER in getattr(m, "r", {})}
    out: dict[str, Value] = {"trainable_params": trainable_count(model)}
    if not adapted:
        out["finetune_method"] = "full" if out["trainable_params"] else "frozen"
        return out
    layer = next(iter(adapted.values()))
    base = layer.get_base_layer()
    dropout = layer.lora_dropout[ADAPTER]
    four_bit = getattr(base.weight, "quant_state", None)
    out.update({
        "finetune_method": "qlora" if four_bit is not None else "lora",
        "lora_targets": ",".join(sorted({n.rsplit(".", 1)[-1] for n in adapted if n.rsplit(".", 1)[-1] != "lm_head"})),
        "lora_head_adapted": any(n.rsplit(".", 1)[-1] == "lm_head" for n in adapted),
        "lora_rank": int(layer.r[ADAPTER]), "lora_alpha": float(layer.lora_alpha[ADAPTER]),
        "lora_scale": float(layer.scaling[ADAPTER]),
        "lora_dropout": float(getattr(dropout, "p", 0.0)),  # nn.Identity where peft saw dropout 0
        "lora_rslora": bool(getattr(getattr(model, "peft_config", {}).get(ADAPTER), "use_rslora", False)),
        "lora_dora": bool(getattr(layer, "use_dora", {}).get(ADAPTER, False)),
        "lora_bias": getattr(getattr(model, "peft_config", {}).get(ADAPTER), "bias", None),
        "base_dtype": _dtype(base.weight) if four_bit is None else f"4-bit {four_bit.quant_type}",
        "adapter_dtype": _dtype(layer.lora_A[ADAPTER].weight),
        "base_frozen": not any(m.get_base_layer().weight.requires_grad for m in adapted.values()),
    })
    if four_bit is not None:
        out.update({"quant_type": four_bit.quant_type, "double_quant": four_bit.nested,
                    "compute_dtype": _dtype_name(getattr(base, "compute_dtype", None)),
                    "quant_storage": _dtype_name(getattr(base.weight, "quant_storage", None))})
    return out


def _dtype_name(dtype) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")
