"""Settings capture: what is really in effect, read from the live objects a framework built.

A worker calls these after its framework has built the model, the optimizer and the data
loader, merges their flat dicts with what only it can know (trainer, precision recipe, seed)
and writes the result as `settings` in its worker report; the host stores it with the run
and shows the settings whose values differ between backends. Values are str / int / float /
bool / None, so the dict is one flat JSON object. Keys every worker must fill are in
`framework_bench.measure.verify.REQUIRED_SETTINGS`.

Stdlib at import; torch is imported inside the functions that need it.
"""

from __future__ import annotations

import functools
import os
from importlib.metadata import PackageNotFoundError, version

Value = str | int | float | bool | None


def installed(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def optimizer_chain(optimizer) -> list:
    """The optimizer and the ones it wraps, outermost first (mmengine's OptimWrapper,
    accelerate's AcceleratedOptimizer, DeepSpeed's ZeRO optimizers all keep theirs as `.optimizer`)."""
    chain = [optimizer]
    for _ in range(5):
        inner = getattr(chain[-1], "optimizer", None)
        if inner is None or not hasattr(inner, "param_groups"):
            break
        chain.append(inner)
    return chain


def inner_optimizer(optimizer):
    """The torch optimizer inside framework wrappers."""
    return optimizer_chain(optimizer)[-1]


def optimizer_settings(optimizer) -> dict[str, Value]:
    """Class, implementation (fused / foreach / for-loop, as torch resolves an unset flag for
    these parameters) and hyper-parameters of the first parameter group."""
    from torch.optim.optimizer import _default_to_fused_or_foreach

    inner = inner_optimizer(optimizer)
    group = inner.param_groups[0]
    fused, foreach = group.get("fused"), group.get("foreach")
    if fused is None and foreach is None:
        params = [p for g in inner.param_groups for p in g["params"]]
        fused, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    betas = group.get("betas")
    return {
        "optimizer": f"{type(inner).__module__}.{type(inner).__qualname__}",
        "optimizer_impl": "fused" if fused else "foreach" if foreach else "for-loop",
        "lr": group.get("lr"),
        "betas": None if betas is None else ",".join(str(float(b)) for b in betas),
        "eps": group.get("eps"),
        "weight_decay": group.get("weight_decay"),
    }


def runtime_settings(train_model) -> dict[str, Value]:
    """Read from the model that really trains (the one the loop calls, wrapper included):
    whether DDP wraps it (DDP keeps a bucket copy of every gradient: a parameter-sized fp32
    buffer under autocast, which the memory estimate counts), the process group it runs in,
    the CUDA caching allocator's configuration the plan set (or the user did), and the GPU
    its parameters live on (None on CPU; the host's sanity anchors key on it)."""
    import torch

    dist = torch.distributed
    in_group = dist.is_available() and dist.is_initialized()
    device = next(train_model.parameters()).device
    return {"ddp_wrapped": isinstance(train_model, torch.nn.parallel.DistributedDataParallel),
            "process_group_size": dist.get_world_size() if in_group else None,
            "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else None}


def param_count(model) -> int:
    """Parameters of the whole model, also when ZeRO-3 has partitioned them (`ds_numel`) or
    bitsandbytes packed them in 4 bits (QLoRA's base: two to a byte; its quant state holds the shape)."""
    return sum(numel(p) for p in model.parameters())


def numel(p) -> int:
    """One parameter's element count, whole: a ZeRO-3 partition's `ds_numel`, a 4-bit weight's shape."""
    state = getattr(p, "quant_state", None)
    if state is not None:
        return int(state.shape.numel())
    return int(getattr(p, "ds_numel", p.numel()))


def _use_reentrant(fn, depth: int = 4) -> bool | None:
    """`use_reentrant` of a checkpoint function: a partial of torch's checkpoint, possibly
    inside a framework's wrapper closure (LLaMA-Factory wraps it once)."""
    if isinstance(fn, functools.partial) and "use_reentrant" in fn.keywords:
        return bool(fn.keywords["use_reentrant"])
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:
            continue
        if depth and callable(inner):
            found = _use_reentrant(inner, depth - 1)
            if found is not None:
                return found
    return None


def model_settings(model) -> dict[str, Value]:
    """Parameter dtype, attention implementation bound in the layers, whether K/V heads are
    repeated to the query heads (GQA), activation checkpointing and its variant; on a
    mixture-of-experts model, the coefficient at which the router's auxiliary loss joins the
    training loss (0: it does not), as the live config says when training starts."""
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    checkpoint_fn = getattr(layers[0], "_gradient_checkpointing_func", None) if layers else None
    settings = {
        "param_dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "attention": attention,
        "attention_kv_repeat": None if kv == heads else kv_repeat(attention),
        "activation_checkpointing": bool(layers),
        "checkpointing_reentrant": _use_reentrant(checkpoint_fn) if checkpoint_fn else None,
    }
    if hasattr(config, "output_router_logits"):  # a MoE family: its forward adds coef * aux when this is on
        settings["router_aux_loss_coef"] = float(config.router_aux_loss_coef) if config.output_router_logits else 0.0
    return settings


def kv_repeat(attention: str | None) -> str:
    """How this env's transformers would feed grouped K/V heads to the kernel, assuming no
    mask: the value until `KvRepeatProbe` saw the first attention call (and for kernels it does
    not see: flash-attn)."""
    if attention == "sdpa":
        try:
            from transformers.integrations.sdpa_attention import use_gqa_in_sdpa
        except ImportError:
            return "repeated (repeat_kv)"
        import inspect

        import torch

        # transformers 5.23 asks for the values too (their head size against the keys'): alike here
        tensors = (torch.empty(0),) * (2 if "value" in inspect.signature(use_gqa_in_sdpa).parameters else 1)
        native = use_gqa_in_sdpa(None, *tensors)
        return "native (sdpa enable_gqa)" if native else "repeated (repeat_kv)"
    if attention == "flash_attention_2":
        return "native (flash-attn)"
    return "repeated (repeat_kv)"


class KvRepeatProbe:
    """How grouped K/V heads really reach the SDPA kernel, read from the first attention call
    of the first step instead of assumed (transformers repeats them unless it can pass
    `enable_gqa`, which it does only without a mask): `install()` before training wraps
    `torch.nn.functional.scaled_dot_product_attention` for that one call, which puts the
    original back, so no later call pays for it; `settle(settings)` then records what it saw."""

    def __init__(self):
        self.seen: str | None = None

    def install(self) -> KvRepeatProbe:
        import torch.nn.functional as F

        original = F.scaled_dot_product_attention

        def first_call(query, key, value, *args, **kwargs):
            F.scaled_dot_product_attention = original
            native = bool(kwargs.get("enable_gqa")) and key.shape[-3] != query.shape[-3]  # (batch, heads, len, dim)
            self.seen = "native (sdpa enable_gqa)" if native else "repeated (repeat_kv)"
            return original(query, key, value, *args, **kwargs)

        F.scaled_dot_product_attention = first_call
        return self

    def settle(self, settings: dict[str, Value]) -> dict[str, Value]:
        """`settings` with `attention_kv_repeat` as the first call showed it; unchanged for a
        model without grouped heads (None) or where no SDPA call was seen (flash-attn kernels)."""
        if self.seen and settings.get("attention_kv_repeat"):
            settings["attention_kv_repeat"] = self.seen
        return settings


def zero_settings(ds_config: dict | None) -> dict[str, Value]:
    """ZeRO stage and the bucket / prefetch sizes of a DeepSpeed config as the engine got it."""
    zero = (ds_config or {}).get("zero_optimization", {}) if ds_config else {}
    out: dict[str, Value] = {"zero_stage": int(zero.get("stage", 0)) if ds_config else 0,
                             "deepspeed_version": installed("deepspeed") if ds_config else None}
    for key in ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
                "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold", "stage3_max_live_parameters"):
        if key in zero:
            value = zero[key]
            out[f"zero_{key}"] = value if isinstance(value, (bool, str)) or value is None else float(value)
    return out


def fsdp2_settings(model) -> dict[str, Value]:
    """ZeRO as FSDP2 (`fully_shard`) holds it in the live model: parameters, gradients and AdamW
    states sharded at both stages; 3 where every unit but the root frees its gathered weights
    after its forward (`fsdp_reshard_after_forward`), 2 where they stay gathered until its
    backward; `zero_settings(None)` (ZeRO 0) where nothing is sharded."""
    import torch

    if not torch.distributed.is_available():
        return zero_settings(None)
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not units:
        return zero_settings(None)
    layers = [m for m in units if m is not model]
    # FSDP2 has no getter for it: a unit's parameter group keeps the mesh it reshards onto after forward, or None
    reshard = bool(layers) and all(m._get_fsdp_state()._fsdp_param_group.post_forward_mesh_info is not None
                                   for m in layers)
    return {"zero_stage": 3 if reshard else 2, "deepspeed_version": None, "fsdp_reshard_after_forward": reshard,
            "fsdp_units": len(units)}


def precision_recipe(param_dtype: str, ds_config: dict | None) -> dict[str, Value]:
    """Gradient reduce dtype, as DeepSpeed or plain data parallel do it: DeepSpeed reduces in
    `communication_data_type` (else the dtype of its low-precision weights); without it
    gradients are reduced in the weights' dtype."""
    if ds_config:
        low = "bfloat16" if (ds_config.get("bf16") or {}).get("enabled") else \
            "float16" if (ds_config.get("fp16") or {}).get("enabled") else None
        return {"grad_reduce_dtype": ds_config.get("communication_data_type") or low or param_dtype}
    return {"grad_reduce_dtype": param_dtype}


def master_weights(model, optimizer) -> Value:
    """Whether the optimizer steps a copy of the weights (DeepSpeed's fp32 partitions, also
    in an fp32 run) or the model's own parameters, read from the live objects: "none", or the
    copy's dtype."""
    chain = optimizer_chain(optimizer)
    for wrapper in chain:
        # DeepSpeed ZeRO-3 / ZeRO-1,2 hold their flat partitions here, and hand them to the torch
        # optimizer only inside its step (its param groups are empty in between under ZeRO-3)
        for held in (getattr(wrapper, "fp32_partitioned_groups_flat", None),
                     getattr(wrapper, "single_partition_of_fp32_groups", None)):
            if held:
                return f"{str(held[0].dtype).removeprefix('torch.')} (the optimizer's copy)"
    own = {id(p) for p in model.parameters()}
    stepped = [p for g in chain[-1].param_groups for p in g["params"]]
    if all(id(p) in own for p in stepped):
        return "none"
    return f"{str(stepped[0].dtype).removeprefix('torch.')} (the optimizer's copy)"


def dataloader_settings(loader) -> dict[str, Value]:
    """Workers, pinned memory and whether the sampler shuffles."""
    sampler = getattr(loader, "sampler", None)
    batch_sampler = getattr(loader, "batch_sampler", None)
    inner = getattr(batch_sampler, "sampler", None) or sampler
    shuffle = getattr(inner, "shuffle", None)
    if shuffle is None and inner is not None:
        shuffle = "Random" in type(inner).__name__
    return {"dataloader_workers": getattr(loader, "num_workers", None),
            "pin_memory": getattr(loader, "pin_memory", None),
            "shuffle": shuffle}


def torch_loop_settings(model, optimizer, *, trainer: str, grad_clip: float | None,
                        autocast_dtype: str | None = None, seed: int | None = None,
                        train_model=None, loss_normalization: str | None = None,
                        sequence_parallel: int = 1) -> dict[str, Value]:
    """The settings of a plain PyTorch loop (no framework), `REQUIRED_SETTINGS` included: what
    the live model (`train_model`: the one the loop calls, DDP wrapper included; default
    `model`) and optimizer say, what the loop tells (its name, clipping, autocast, seed, how
    it normalises the step's loss),
    and what such a loop is by construction: no loss scaler, ZeRO only as FSDP2 shards the model
    (`fsdp2_settings`), rows fed in order from the main process (no data loader)."""
    param_dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    trained = model if train_model is None else train_model
    return {"trainer": trainer, **optimizer_settings(optimizer), "grad_clip": grad_clip, **model_settings(model),
            "autocast_dtype": autocast_dtype, "loss_scaler": "none", **precision_recipe(param_dtype, None),
            "master_weights": master_weights(model, optimizer),
            **fsdp2_settings(model), "dataloader_workers": 0, "pin_memory": False, "shuffle": False,
            "seed": seed, "compile": type(trained).__name__ == "OptimizedModule",  # torch.compile's wrapper
            **runtime_settings(trained),
            "ddp_find_unused_parameters": getattr(train_model, "find_unused_parameters", None),  # DDP-wrapped only
            # its sequence parallel as the loop says (Ulysses in the reference); tokens counted with no collective
            "sequence_parallel": sequence_parallel, "token_count_sync": False,
            **versions(), **({"loss_normalization": loss_normalization} if loss_normalization else {})}


def versions() -> dict[str, Value]:
    return {"torch_version": installed("torch"), "transformers_version": installed("transformers"),
            "flash_attn_version": installed("flash-attn") or installed("flash_attn")}
