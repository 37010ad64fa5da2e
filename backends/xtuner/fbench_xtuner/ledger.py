"""The settings ledger of an XTuner run: what really trains, read from the objects mmengine's
Runner built (the model, its wrapper, the optimizer wrapper, DeepSpeed's engine), not from the
config that asked for them."""

from __future__ import annotations

import sys

from mmengine.model import is_model_wrapper

from framework_bench.worker import settings as capture


def unwrap(model):
    """The model inside mmengine's DDP or DeepSpeed wrapper, or the model itself."""
    return model.module if is_model_wrapper(model) else model


def effective_settings(runner, sp_size: int) -> dict:
    """What XTuner really trains with, read from the objects the Runner built."""
    from mmengine.optim import AmpOptimWrapper

    llm = unwrap(runner.model).llm
    wrapper = runner.optim_wrapper
    strategy = getattr(runner, "strategy", None)
    ds = getattr(strategy, "config", None) if type(strategy).__name__ == "DeepSpeedStrategy" else None
    amp = isinstance(wrapper, AmpOptimWrapper)
    model = capture.model_settings(llm)
    if model["attention"] == "flash_attention_2" and model["attention_kv_repeat"]:
        model["attention_kv_repeat"] = "repeated (XTuner's dispatched flash-attn forward)"
    clip = ds.get("gradient_clipping") if ds else (wrapper.clip_grad_kwargs or {}).get("max_norm")
    accumulation = ds.get("gradient_accumulation_steps") if ds else wrapper._accumulative_counts
    return {
        "trainer": "mmengine-flexible+deepspeed" if ds else "mmengine-runner",
        **capture.optimizer_settings(wrapper),
        "grad_clip": clip,
        **model,
        "autocast_dtype": str(wrapper.cast_dtype).removeprefix("torch.") if amp else
        ("bfloat16" if ds and (ds.get("bf16") or {}).get("enabled") else None),
        "loss_scaler": type(wrapper.loss_scaler).__name__ if amp and wrapper.loss_scaler.is_enabled() else "none",
        **capture.precision_recipe(model["param_dtype"], ds),
        "master_weights": capture.master_weights(llm, wrapper),
        **capture.zero_settings(ds),
        **capture.dataloader_settings(runner.train_dataloader),
        "sequence_parallel": sp_size,
        "seed": runner.seed,
        "compile": compiled(runner),
        "token_count_sync": False,  # XTuner's ThroughputHook counts each rank's tokens with no collective
        "loss_normalization": loss_normalization(llm, sp_size, accumulation),
        "ddp_find_unused_parameters": getattr(runner.model, "find_unused_parameters", None),  # DDP-wrapped only
        **capture.runtime_settings(runner.model),
        **capture.versions(),
    }


def compiled(runner) -> bool:
    """Whether what trains went through torch.compile: mmengine's Runner replaces the model's
    `train_step` with torch.compile's wrapper (`_maybe_compile`), the FlexibleRunner's strategy
    compiles the module itself. Read from the live objects: mmengine 0.10's Runner has no
    `_compile` attribute to read (only the FlexibleRunner has)."""
    step = getattr(runner.model, "train_step", None)
    return hasattr(step, "_torchdynamo_orig_callable") or any(
        type(m).__name__ == "OptimizedModule" for m in (runner.model, getattr(runner.model, "module", None)))


def loss_normalization(llm, sp_size: int, accumulation: int) -> str:
    """How XTuner's step loss is normalised: SupervisedFinetune returns the HF model's loss (a
    mean over the micro-batch's labels after the shift; with SP, XTuner's token-weighted
    reduction over the SP group), and mmengine (or DeepSpeed) divides each micro-batch's
    loss by the accumulation count: a mean of per-micro-batch means."""
    micro = ("token mean over the SP group (reduce_sequence_parallel_loss)" if sp_size > 1 else
             f"{type(llm).__name__} token mean per micro-batch, labels counted after the shift")
    return f"{micro}; mean over the step's {accumulation} micro-batch(es)"


def zero_stage_in_effect(runner) -> int:
    """The ZeRO stage of the engine that really trains: 0 unless the model is wrapped by a
    DeepSpeed engine (mmengine's MMDeepSpeedEngineWrapper holds it as `.model`)."""
    deepspeed = sys.modules.get("deepspeed")  # imported by the DeepSpeed strategy only
    engine = getattr(runner.model, "model", None)
    return engine.zero_optimization_stage() if deepspeed and isinstance(engine, deepspeed.DeepSpeedEngine) else 0
