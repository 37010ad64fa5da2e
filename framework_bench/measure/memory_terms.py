"""The terms of one training step's memory, in bytes per GPU, for a decoder of any family
(`scenario/families.py`) trained with AdamW (`memory.py` assembles them into the step's phases):
weights, gradients and optimizer states by precision scheme and ZeRO sharding (a MoE model's every
expert: all of them train, whichever tokens they saw); activations of the local sequence
(memory-efficient attention: no s x s score matrix; a MoE layer's for the tokens routed to each
of its top-k experts); logits; the optimizer step's temporaries; DDP's buckets; a fixed overhead;
for a frozen base with adapters (LoRA, QLoRA), its 4-bit weights and the adapters'.

Precision schemes, by where a parameter's 16 bytes (params + grads + AdamW states) live:
- ``amp``: torch autocast over fp32 parameters, 4 + 4 + 8; a bf16 copy of each weight cached
  through the forward pass, an fp32 residual stream, gradients freed between steps;
- ``deepspeed``: DeepSpeed bf16, 2 + 2 + 12 (fp32 master, m, v), its buffers resident all step;
- ``fp32``: no mixed precision, 4 + 4 + 8, fp32 activations;
- ``fsdp2``: a backend's sequence parallel on FSDP2 (`MemoryScheme`): fp32 4 + 4 + 8 sharded
  over the world at every ZeRO stage, bf16 compute and activations, the weights built on rank 0
  and scattered (no full copy on a GPU);
- ``lora``, ``qlora``: a frozen base (4-bit linears under QLoRA) with fp32 adapters.
"""

from __future__ import annotations

from typing import Literal

from framework_bench.plugins.contract import OptimizerImpl
from framework_bench.scenario.finetune import FineTune
from framework_bench.scenario.models import ModelArch, parameter_count, parameter_counts
from framework_bench.scenario.scenario import Scenario

GIB = 1024**3

Scheme = Literal["amp", "deepspeed", "fp32", "fsdp2", "lora", "qlora"]


# Fixed overheads, bytes.
CUDA_CONTEXT_BYTES = 1.0 * GIB  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator
ALLOCATOR_SLACK_BYTES = 1.0 * GIB  # caching-allocator fragmentation (reserved but unused)
NCCL_BYTES = 0.5 * GIB  # NCCL communicator buffers, only with more than one process

# DeepSpeed defaults (elements): matched mode writes only the stage and overlap_comm for
# every backend, so the defaults hold.
DS_REDUCE_BUCKET = 5e8
DS_ALLGATHER_BUCKET = 5e8
DS_STAGE3_PREFETCH = 5e7
DS_STAGE3_MAX_LIVE = 1e9


# ---------------------------------------------------------------------------------------
# Weights, gradients, optimizer states

_BYTES_PER_PARAM: dict[Scheme, tuple[int, int, int]] = {
    # (parameters, gradients, optimizer states)
    "amp": (4, 4, 8),  # fp32 params, fp32 grads, Adam m + v (the params are the master copy)
    "deepspeed": (2, 2, 12),  # bf16 params, bf16 grads, fp32 master + m + v
    "fp32": (4, 4, 8),
    "fsdp2": (4, 4, 8),  # fp32 params, fp32 grads, Adam m + v; sharded whatever the ZeRO stage
}


def parameters_bytes(n_params: int, scheme: Scheme, zero_stage: int, group: int) -> float:
    """Model weights held by one GPU: sharded only at ZeRO-3."""
    per = _BYTES_PER_PARAM[scheme][0]
    return n_params * per / (group if zero_stage >= 3 else 1)


def gradients_bytes(n_params: int, scheme: Scheme, zero_stage: int, group: int) -> float:
    """Gradients held by one GPU: sharded from ZeRO-2 on."""
    per = _BYTES_PER_PARAM[scheme][1]
    return n_params * per / (group if zero_stage >= 2 else 1)


def optimizer_states_bytes(n_params: int, scheme: Scheme, zero_stage: int, group: int) -> float:
    """AdamW states (and the fp32 master copy under DeepSpeed bf16): sharded from ZeRO-1 on."""
    per = _BYTES_PER_PARAM[scheme][2]
    return n_params * per / (group if zero_stage >= 1 else 1)


def gathered_parameters_bytes(arch: ModelArch, zero_stage: int) -> float:
    """ZeRO-3 all-gathers full bf16 weights before each module runs: the layer in use plus
    the prefetch bucket, capped by stage3_max_live_parameters."""
    if zero_stage < 3:
        return 0.0
    return 2 * min(DS_STAGE3_MAX_LIVE, parameter_counts(arch)["layer"] + DS_STAGE3_PREFETCH)


def fsdp2_gathered_bytes(arch: ModelArch, n_params: int, zero_stage: int) -> float:
    """FSDP2 all-gathers bf16 weights per layer: without resharding after forward (ZeRO < 3)
    they stay gathered until backward, i.e. the whole model; with it, the layer in use and
    the next one it prefetches."""
    return 2.0 * (n_params if zero_stage < 3 else 2 * parameter_counts(arch)["layer"])


def weight_cache_bytes(n_params: int, scheme: Scheme) -> float:
    """amp only: autocast caches a bf16 copy of every fp32 weight it casts (leaf tensors
    that require grad), for the whole autocast region, i.e. the forward pass."""
    return 2.0 * n_params if scheme == "amp" else 0.0


# ---------------------------------------------------------------------------------------
# Activations


def layer_input_bytes_per_token(arch: ModelArch, scheme: Scheme) -> int:
    """A checkpointed layer keeps only its input, the residual stream: fp32 under amp
    (the fp32 embedding output plus bf16 sub-layer outputs promote to fp32), bf16 under
    DeepSpeed, fp32 without mixed precision."""
    return (2 if scheme in ("deepspeed", "fsdp2") else 4) * arch.hidden_size


def layer_activation_bytes_per_token(arch: ModelArch, scheme: Scheme, moe: bool = False) -> int:
    """Tensors one HF decoder layer saves for backward, per token, excluding its input.

    Counted from the HF implementation (RMSNorm computes in fp32; SDPA/flash attention
    saves q, k, v, the output and a per-row logsumexp, no s x s matrix; GQA k and v at
    their kv width; the SwiGLU MLP at its real intermediate size i). With h = hidden,
    q = heads x head_dim (h for Llama), kv = kv_heads x head_dim:

    deepspeed (bf16 activations): 16h + 6q + 4kv + 8i
      each RMSNorm 8h (fp32 copy of its input 4h, bf16 normalised 2h, bf16 output 2h);
      attention 6q + 4kv (q after RoPE 2q, k, v 2kv each, SDPA output 2q, contiguous
      o_proj input 2q); MLP 8i (gate, silu(gate), up, and their product, 2i each).
    amp (autocast, fp32 residual): 22h + 6q + 4kv + 8i
      RMSNorm on the fp32 stream saves its fp32 product 4h, and every projection saves its
      own bf16 cast of the fp32 norm output (3 x 2h for q/k/v, 2 x 2h for gate/up); RoPE
      with fp32 cos/sin promotes q, k to fp32, which SDPA casts back to bf16; the second
      norm also saves its fp32 input 4h (the first norm's input is the layer input).
    fp32: 24h + 12q + 8kv + 16i (the deepspeed tensors at 4 bytes, norms 12h each).
    Per-head q/k norms (Qwen3) save what a norm does, over q and kv: 8 (12 in fp32) bytes each.
    A MoE layer's MLP (`moe`), per token: the router's logits and fp32 softmax (8 x experts); for
    each of its top-k experts the gathered input and the weighted output (2h each, fp32 4h), gate
    and up, silu and the product (8 x moe_intermediate, 16 in fp32); a shared expert as a dense MLP
    of its width plus its gated output (2h)."""
    h, q, kv = arch.hidden_size, arch.q_dim, arch.kv_dim
    wide = 2 if scheme == "fp32" else 1  # fp32 activations: twice the bf16 bytes
    qk_norm = (12 if scheme == "fp32" else 8) * (q + kv) if arch.family.qk_norm else 0
    if moe:
        shared = (8 * wide * arch.shared_expert_intermediate_size + 2 * wide * h
                  if arch.family.shared_expert else 0)
        mlp = 8 * arch.num_experts + arch.num_experts_per_tok * (4 * wide * h + 8 * wide * arch.moe_intermediate_size) + shared
        up_casts = 2 * h  # amp: the router's bf16 copy of the norm output (the experts cast what they gather)
    else:
        mlp, up_casts = 8 * wide * arch.intermediate_size, 2 * 2 * h
    if scheme in ("deepspeed", "fsdp2"):
        return 16 * h + 6 * q + 4 * kv + qk_norm + mlp
    if scheme == "amp":
        norm1 = 4 * h + 3 * 2 * h
        attention = 2 * q + 2 * kv + 2 * kv + 2 * q + 2 * q
        norm2 = 4 * h + 4 * h + up_casts
        return norm1 + attention + norm2 + qk_norm + mlp  # 22h + 6q + 4kv + 8i
    return 24 * h + 12 * q + 8 * kv + qk_norm + mlp


def mlp_width(arch: ModelArch, moe: bool) -> int:
    """The intermediate width one token's MLP runs at: a dense layer's, or a MoE layer's top-k
    experts' and shared expert's together."""
    if not moe:
        return arch.intermediate_size
    return arch.num_experts_per_tok * arch.moe_intermediate_size + (arch.shared_expert_intermediate_size or 0)


def layer_kinds(arch: ModelArch) -> dict[bool, int]:
    """How many layers are dense (False) and MoE (True)."""
    n_moe = len(arch.moe_layers)
    return {kind: n for kind, n in ((False, arch.num_hidden_layers - n_moe), (True, n_moe)) if n}


def backward_temporaries_bytes_per_token(arch: ModelArch, scheme: Scheme, moe: bool = False) -> int:
    """Gradients in flight while one layer is back-propagated: the residual-stream gradient
    coming in and going out (fp32 under amp/fp32, bf16 under DeepSpeed) and two gradients
    of the MLP intermediate (a MoE layer's at its experts' width, `mlp_width`)."""
    h, i = arch.hidden_size, mlp_width(arch, moe)
    g = 2 if scheme in ("deepspeed", "fsdp2") else 4
    a = 4 if scheme == "fp32" else 2
    return 2 * g * h + 2 * a * i


def stored_activations_bytes(arch: ModelArch, scheme: Scheme, tokens: int, checkpointing: bool) -> float:
    """Activations held from the forward pass until backward reaches them: every layer's
    input with checkpointing, every layer's saved tensors (input included) without."""
    total = 0
    for moe, n in layer_kinds(arch).items():
        per_layer = layer_input_bytes_per_token(arch, scheme)
        if not checkpointing:
            per_layer += layer_activation_bytes_per_token(arch, scheme, moe)
        total += n * per_layer
    return float(total * tokens)


def layer_working_bytes(arch: ModelArch, scheme: Scheme, tokens: int, checkpointing: bool) -> float:
    """Extra memory while one layer is back-propagated (the largest kind of layer): with
    checkpointing, that layer's recomputed activations (and, under amp, the bf16 copies of its
    weights autocast makes again) plus the gradient temporaries; without, just the temporaries."""
    working = 0.0
    for moe in layer_kinds(arch):
        per_token = backward_temporaries_bytes_per_token(arch, scheme, moe)
        extra = 0.0
        if checkpointing:
            per_token += layer_activation_bytes_per_token(arch, scheme, moe)
            if scheme == "amp":
                extra = 2.0 * parameter_counts(arch)["layer"]
        working = max(working, per_token * tokens + extra)
    return working


def logits_bytes(arch: ModelArch, scheme: Scheme, tokens: int) -> float:
    """The LM head's output for the local tokens and the loss on it: bf16 logits (2 bytes,
    kept by the model output), their fp32 upcast for the cross-entropy (4; log-softmax
    saves an fp32 tensor of the same size) and the fp32 gradient (4) = 10 bytes per token
    per vocabulary entry; 12 without mixed precision (fp32 logits)."""
    per = 12 if scheme == "fp32" else 10
    return float(per * tokens * arch.vocab_size)


def tiled_head_bytes(arch: ModelArch, scheme: Scheme, tokens: int, tile: tuple[int, int], head_trained: bool) -> float:
    """An LM head whose loss never holds the logits whole (a backend's declared `lm_head_tile`,
    a fused head): one (tokens, vocabulary) tile in the compute dtype (2 bytes, 4 under
    fp32), eight fp32 statistics per token, and the fp32 gradients its backward accumulates
    for the hidden states and, when the head trains, for its weight."""
    t, v = min(tile[0], tokens), min(tile[1], arch.vocab_size)
    per = 4 if scheme == "fp32" else 2
    head_grad = 4.0 * arch.vocab_size * arch.hidden_size if head_trained else 0.0
    return float(per * t * v + 8 * 4 * tokens + 4 * tokens * arch.hidden_size + head_grad)


# ---------------------------------------------------------------------------------------
# The optimizer step


def optimizer_temporaries_bytes(arch: ModelArch, n_params: int, scheme: Scheme, impl: OptimizerImpl,
                                optimizer_shard: int) -> float:
    """What the optimizer step allocates on top of the states, for the parameters this GPU
    steps (n / `optimizer_shard`): foreach AdamW's `_foreach_sqrt(exp_avg_sqs)`, an fp32
    tensor per parameter, all at once; the for-loop one parameter at a time (the largest is
    an embedding); fused AdamW in place. DeepSpeed bf16 first copies the gradient
    partition to fp32 for its fp32 master weights."""
    stepped = n_params / optimizer_shard
    temp = {"fused": 0.0, "foreach": 4.0 * stepped, "for-loop": 4.0 * parameter_counts(arch)["largest_tensor"]}[impl]
    return temp + (4.0 * stepped if scheme == "deepspeed" else 0.0)


def ddp_buckets_bytes(n_params: int, scheme: Scheme, wrapped: bool) -> float:
    """DDP's gradient buckets: a copy of every gradient (gradient_as_bucket_view off, torch's
    default), allocated when the model is wrapped and kept for the whole run."""
    return gradients_bytes(n_params, scheme, 0, 1) if wrapped else 0.0


# ---------------------------------------------------------------------------------------
# Overhead


def overhead_bytes(scenario: Scenario, scheme: Scheme, n_params: int) -> float:
    """Fixed costs: CUDA context, allocator slack (fragmentation: reserved but unused), and
    with more than one process NCCL buffers plus the engine's communication buffers:
    DeepSpeed's reduce bucket (ZeRO-3), reduce + all-gather buckets double-buffered by
    overlap_comm (ZeRO-1/2), FSDP2's reduce-scatter buffers. DDP's buckets are their own
    term (`ddp_buckets_bytes`)."""
    total = CUDA_CONTEXT_BYTES + ALLOCATOR_SLACK_BYTES
    if scenario.cluster.gpus == 1:
        return total
    total += NCCL_BYTES
    if scheme == "fsdp2":
        # reduce-scatter of one layer's fp32 gradients, double-buffered with the next layer's
        total += 2 * 4 * parameter_counts(scenario.arch)["layer"]
    elif scheme == "deepspeed":
        if scenario.zero_stage >= 3:
            total += 2 * min(DS_REDUCE_BUCKET, n_params)
        elif scenario.zero_stage >= 1:
            total += 2 * 2 * (min(DS_REDUCE_BUCKET, n_params) + min(DS_ALLGATHER_BUCKET, n_params))
    return total


# ---------------------------------------------------------------------------------------
# A frozen base with adapters (LoRA, QLoRA)

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
QUANT_BLOCK = 64  # bitsandbytes' 4-bit blocksize: one absmax scale per 64 weights
DOUBLE_QUANT_BLOCK = 256  # double quant: the 8-bit absmax scales get one fp32 scale per 256 of them


def four_bit_bytes_per_param(double_quant: bool) -> float:
    """A bitsandbytes 4-bit weight (nf4 or fp4): half a byte, plus its block's absmax: fp32
    (4 / 64 bytes per weight), or with double quant 8-bit (1 / 64) plus one fp32 second-level
    scale per 256 blocks (4 / (64 x 256)) (and a 256-entry code book per tensor, left out)."""
    scales = 1 / QUANT_BLOCK + 4 / (QUANT_BLOCK * DOUBLE_QUANT_BLOCK) if double_quant else 4 / QUANT_BLOCK
    return 0.5 + scales


def linear_parameter_count(arch: ModelArch) -> int:
    """The decoder layers' linear modules' weights, the ones QLoRA stores in 4 bits (a MoE's routed
    experts are 3D tensors in transformers >= 5, not linear modules: they stay at the compute dtype)."""
    return parameter_counts(arch)["linear"]


def frozen_base_bytes(arch: ModelArch, finetune: FineTune) -> float:
    """The frozen base weights: every parameter at `base_dtype`, or (QLoRA) the decoder linears
    in 4 bits and the embeddings, LM head and norms at the compute dtype."""
    n = parameter_count(arch)
    if finetune.method == "lora":
        return float(n * DTYPE_BYTES[finetune.base_dtype])
    linear = linear_parameter_count(arch)
    return linear * four_bit_bytes_per_param(finetune.double_quant) + (n - linear) * DTYPE_BYTES[finetune.compute_dtype]


def adapter_activation_bytes_per_token(arch: ModelArch, finetune: FineTune, scheme: Scheme) -> int:
    """What one layer's adapters keep for backward, per token: per target, its input cast to the
    adapters' fp32 (lora_A's input; the base linear's own input when that is already fp32 and
    there is no dropout), dropout's mask (1 byte per input) when dropout > 0, and A's fp32
    output (B's input, r wide)."""
    shapes = arch.linear_shapes
    total = 0
    for t in finetune.targets:
        width = shapes[t][0]
        shared = scheme == "fp32" and finetune.dropout == 0
        total += (0 if shared else 4 * width) + (width if finetune.dropout > 0 else 0) + 4 * finetune.rank
    return total


def adapter_optimizer_temporaries_bytes(arch: ModelArch, finetune: FineTune, impl: OptimizerImpl,
                                        optimizer_shard: int) -> float:
    """`optimizer_temporaries_bytes` for the fp32 adapters: foreach's sqrt over every one this
    GPU steps, the for-loop's over the largest (a B or A of the widest target), fused none."""
    shapes = arch.linear_shapes
    largest = max(finetune.rank * max(shapes[t]) for t in finetune.targets)
    stepped = finetune.adapter_parameter_count(arch) / optimizer_shard
    return {"fused": 0.0, "foreach": 4.0 * stepped, "for-loop": 4.0 * largest}[impl]
