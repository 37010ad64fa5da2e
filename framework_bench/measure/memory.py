"""Per-GPU memory fit-check: will a scenario's training step fit on a GPU?

Pure arithmetic on the scenario and its architecture (no torch). Every term is a small
function below, in bytes per GPU, for a Llama decoder trained with AdamW:

- parameters, gradients, optimizer states: bytes per parameter set by the precision
  scheme (see `scheme_for`), each divided by the ZeRO sharding group when the stage shards
  it (stage 1: optimizer states; 2: + gradients; 3: + parameters);
- activations for the local sequence s/SP: with checkpointing, every layer's input plus
  one layer's full activations while it is recomputed and back-propagated; without, every
  layer's activations. Memory-efficient attention (flash / SDPA), so no s^2 score matrix;
- the logits for the local sequence (bf16 logits, fp32 upcast for the loss, its gradient);
- the optimizer step's temporaries: foreach AdamW's parameter-sized fp32 tensor (it
  computes sqrt(v) for every parameter at once; fused AdamW works in place, the for-loop
  one parameter at a time), and under DeepSpeed the fp32 copy of the gradient partition;
- DDP's gradient buckets where the model is wrapped in DDP (a second copy of the
  gradients, resident for the whole run);
- a fixed overhead (CUDA context, allocator slack, NCCL and framework buffers).

The terms do not all live at once. The total is the peak over three moments of a step
(`phases`): the end of the forward pass (the loss: every stored activation and the
logits), the backward pass (stored activations, one layer's recompute working set and
the gradients) and the optimizer step (no activations; states, gradients and the step's
temporaries). Summing everything instead over-estimates the measured plain-PyTorch 7B
32k peak by ~25%. Calibration (tests/test_memory.py): the one-H200 Llama2-7B peaks of
issue 17, with fused AdamW (102/117 GiB and 102/115 GiB at 8k/32k, two backends) and with
foreach AdamW, not DDP-wrapped (126 GiB at both).

What differs between backends enters only through what they declare (`MemoryScheme`,
`BackendInfo.memory`: their AdamW implementation per settings mode, the engine of their
sequence parallel) or what a run recorded (`optimizer_impl`, `ddp_wrapped`): no term here
is keyed on a backend's name.

Precision schemes, because they differ in where the 16 bytes per parameter live:
- ``amp``: torch autocast with fp32 parameters (a plain loop, or a trainer's
  autocast wrapper without DeepSpeed). fp32 params 4 + fp32 grads 4 + Adam m, v 8 = 16
  bytes/param. Autocast caches a bf16 copy of every weight during the forward pass (2
  bytes/param, freed when the autocast region ends, before backward), the residual
  stream stays fp32, and gradients are freed by `zero_grad(set_to_none=True)` between steps,
  so they only grow during backward while the stored activations are released.
- ``deepspeed``: DeepSpeed bf16: bf16 params 2 + bf16 grads 2 + fp32 master, m, v 12 =
  16 bytes/param, gradient and partition buffers resident for the whole step;
  bf16 activations.
- ``fp32``: no mixed precision: 4 + 4 + 8 bytes/param (grads freed between steps as in
  amp), fp32 activations.
- ``fsdp2``: sequence parallel on FSDP2 (a backend declares it, `MemoryScheme`): the model is
  cast to fp32 and fully sharded over the world (FSDP2 `fully_shard`, every ZeRO stage):
  fp32 params 4 + fp32 grads 4 (reduce_dtype fp32) + Adam m, v 8 = 16 bytes/param, all
  divided by the world; bf16 compute (param_dtype bf16), so bf16 activations; gathered bf16
  weights: the whole model between forward and backward when parameters are not
  resharded after forward (ZeRO < 3), else the layer in use and the prefetched next one.
  Its sequence-parallel loss (`sequence_parallel_loss`) upcasts the bf16 logits with
  `.float()` and runs cross-entropy on that view (no further copy): 2 + 4 + 4 bytes per
  token per vocabulary entry, as `logits_bytes` counts for every scheme. Weights are built
  on global rank 0 in host memory and scattered (`init_on_rank0`): no full copy on a GPU.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from framework_bench.measure import gpus
from framework_bench.plugins.contract import MemoryScheme, OptimizerImpl
from framework_bench.spec.finetune import FineTune
from framework_bench.spec.models import ModelArch
from framework_bench.spec.scenario import Scenario
from framework_bench.worker.job import SettingsMode

GIB = 1024**3

Scheme = Literal["amp", "deepspeed", "fp32", "fsdp2", "lora", "qlora"]
Phase = Literal["forward", "backward", "optimizer step"]


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


class MemoryEstimate(BaseModel):
    """Per-GPU memory of one training step, GiB. `total_gib` is the peak over the forward,
    backward and optimizer-step phases (`peak_phase`), not the sum of the terms."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    scheme: Scheme
    optimizer_impl: OptimizerImpl
    ddp_wrapped: bool
    zero_stage: int
    world_size: int
    sharding_group: int
    local_tokens: int  # tokens one GPU holds activations for (`tokens_per_gpu_micro_batch`)
    activation_checkpointing: bool

    parameters_gib: float
    gradients_gib: float
    optimizer_states_gib: float
    gathered_parameters_gib: float  # ZeRO-3: full bf16 weights gathered for the layers in use
    weight_cache_gib: float  # amp: autocast's bf16 copies of the weights during forward
    stored_activations_gib: float  # checkpointed layer inputs, or every layer's activations
    layer_working_gib: float  # one layer recomputed + its backward temporaries
    activations_gib: float  # stored + working
    logits_gib: float
    optimizer_temporaries_gib: float  # the optimizer step's own: foreach temporary, DeepSpeed's fp32 grads
    ddp_buckets_gib: float  # DDP's gradient buckets (a copy of the gradients) when wrapped
    overhead_gib: float

    forward_peak_gib: float
    backward_peak_gib: float
    step_peak_gib: float
    peak_phase: Phase
    total_gib: float
    gpu_memory_gib: float | None = None
    fits: bool | None = None

    @property
    def phases(self) -> dict[str, float]:
        return {"forward": self.forward_peak_gib, "backward": self.backward_peak_gib,
                "optimizer step": self.step_peak_gib}

    def phases_line(self) -> str:
        """'forward 96.3 / backward 105.0 / optimizer step 102.4 GiB'"""
        return " / ".join(f"{name} {gib:.1f}" for name, gib in self.phases.items()) + " GiB"

    def summary(self) -> str:
        terms = (
            f"params {self.parameters_gib:.1f} + grads {self.gradients_gib:.1f} + "
            f"optim {self.optimizer_states_gib:.1f}"
            + (f" + gathered {self.gathered_parameters_gib:.1f}" if self.gathered_parameters_gib else "")
            + (f" + autocast cache {self.weight_cache_gib:.1f}" if self.weight_cache_gib else "")
            + (f" + DDP buckets {self.ddp_buckets_gib:.1f}" if self.ddp_buckets_gib else "")
            + f", activations {self.activations_gib:.1f}, logits {self.logits_gib:.1f}, "
            f"step temporaries {self.optimizer_temporaries_gib:.1f} ({self.optimizer_impl} AdamW), "
            f"overhead {self.overhead_gib:.1f}"
        )
        head = (
            f"~{self.total_gib:.1f} GiB per GPU at the {self.peak_phase} ({self.phases_line()}; {self.scheme}, "
            f"ZeRO-{self.zero_stage} over {self.sharding_group}, {self.local_tokens} tokens/GPU; {terms})"
        )
        if self.gpu_memory_gib is None:
            return head + ", GPU memory unknown"
        verdict = "fits" if self.fits else "does NOT fit"
        return f"{head} {verdict} in {self.gpu_memory_gib:.1f} GiB"


# ---------------------------------------------------------------------------------------
# Model size


def layer_parameter_count(arch: ModelArch) -> int:
    """One decoder layer: q, o (h x h), k, v (h x kv), gate, up, down (h x i), two RMSNorms."""
    h, i = arch.hidden_size, arch.intermediate_size
    kv = arch.num_key_value_heads * arch.head_dim
    return 2 * h * h + 2 * h * kv + 3 * h * i + 2 * h


def parameter_count(arch: ModelArch) -> int:
    """All parameters: embeddings and an untied LM head (V x h each), layers, final norm."""
    return 2 * arch.vocab_size * arch.hidden_size + arch.num_hidden_layers * layer_parameter_count(arch) + arch.hidden_size


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
    """The decoder layers' linear weights, the ones QLoRA stores in 4 bits."""
    return arch.num_hidden_layers * sum(i * o for i, o in arch.linear_shapes.values())


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


def activation_scheme(scenario: Scenario) -> Scheme:
    """The full fine-tuning scheme whose activations a LoRA/QLoRA step holds: fp32 without mixed
    precision; an fp32 base (or compute dtype) under bf16 autocast, amp; else bf16, deepspeed's."""
    ft = scenario.finetune
    dtype = ft.base_dtype if ft.method == "lora" else ft.compute_dtype
    if scenario.precision == "fp32":
        return "fp32"
    return "amp" if dtype == "fp32" else "deepspeed"


def adapter_optimizer_temporaries_bytes(arch: ModelArch, finetune: FineTune, impl: OptimizerImpl,
                                        optimizer_shard: int) -> float:
    """`optimizer_temporaries_bytes` for the fp32 adapters: foreach's sqrt over every one this
    GPU steps, the for-loop's over the largest (a B or A of the widest target), fused none."""
    shapes = arch.linear_shapes
    largest = max(finetune.rank * max(shapes[t]) for t in finetune.targets)
    stepped = finetune.adapter_parameter_count(arch) / optimizer_shard
    return {"fused": 0.0, "foreach": 4.0 * stepped, "for-loop": 4.0 * largest}[impl]


def adapter_phases(scenario: Scenario, impl: OptimizerImpl, wrapped: bool) -> tuple[dict[str, float], dict[Phase, float]]:
    """Every term (bytes) of a LoRA/QLoRA step and the peak of each phase, as `estimate` has them."""
    arch, ft = scenario.arch, scenario.finetune
    n_adapter = ft.adapter_parameter_count(arch)
    group, zero = sharding_group(scenario), scenario.zero_stage
    tokens = scenario.tokens_per_gpu_micro_batch
    ckpt = scenario.activation_checkpointing
    act = activation_scheme(scenario)
    per_layer_adapters = adapter_activation_bytes_per_token(arch, ft, act) * tokens
    # bitsandbytes dequantizes one 4-bit weight at a time to the compute dtype for its matmul
    dequantized = (DTYPE_BYTES[ft.compute_dtype] * max(i * o for i, o in arch.linear_shapes.values())
                   if ft.method == "qlora" else 0.0)
    terms = {
        "params": frozen_base_bytes(arch, ft) / (group if zero >= 3 else 1) + parameters_bytes(n_adapter, "fp32", zero, group),
        "grads": gradients_bytes(n_adapter, "fp32", zero, group),
        "optim": optimizer_states_bytes(n_adapter, "fp32", zero, group),
        "gathered": 0.0,
        # autocast caches bf16 copies of the weights that require grad: the adapters only
        "cache": weight_cache_bytes(n_adapter, "amp") if scenario.precision != "fp32" else 0.0,
        "stored": (stored_activations_bytes(arch, act, tokens, ckpt)
                   + (0.0 if ckpt else arch.num_hidden_layers * per_layer_adapters)),
        "working": layer_working_bytes(arch, act, tokens, ckpt) + (per_layer_adapters if ckpt else 0.0) + dequantized,
        "logits": logits_bytes(arch, act, tokens),
        "temporaries": adapter_optimizer_temporaries_bytes(arch, ft, impl, group if zero >= 1 else 1),
        "buckets": ddp_buckets_bytes(n_adapter, "fp32", wrapped),
        "overhead": overhead_bytes(scenario, "amp", n_adapter),
    }
    resident = terms["params"] + terms["optim"] + terms["buckets"] + terms["overhead"]
    # gradients appear during backward and are freed between steps, as under amp
    peaks = phases("amp", resident, terms["grads"], terms["cache"], terms["stored"], terms["working"],
                   terms["logits"], terms["temporaries"])
    return terms, peaks


# ---------------------------------------------------------------------------------------
# Scheme and sharding


def scheme_for(scenario: Scenario, declared: MemoryScheme | None = None) -> Scheme:
    """How a backend declaring `declared` trains this scenario: its sequence parallel on the
    engine it declares (DeepSpeed or FSDP2); DeepSpeed for any ZeRO stage; otherwise
    torch autocast over fp32 parameters."""
    declared = declared or MemoryScheme()
    if scenario.finetune.method != "full":
        return scenario.finetune.method
    if scenario.precision == "fp32":
        return "fp32"
    if scenario.sequence_parallel > 1:
        return declared.sequence_parallel
    if scenario.zero_stage > 0:
        return "deepspeed"
    return "amp"


def ddp_wraps(scenario: Scenario, scheme: Scheme) -> bool:
    """Whether the model trains inside DDP: several processes without ZeRO or FSDP. A world
    of one is never wrapped (every backend's worker keeps it bare, and records `ddp_wrapped`)."""
    return scenario.cluster.gpus > 1 and scenario.zero_stage == 0 and scheme in ("amp", "fp32", "lora", "qlora")


def sharding_group(scenario: Scenario) -> int:
    """Ranks a ZeRO stage partitions over: the whole world, not world / SP. A DeepSpeed
    engine built without an mpu (as the sequence-parallel strategies build it) partitions
    over every rank and the SP ranks
    of a sequence each hold 1/world of the states (DeepSpeed-Ulysses' sequence-data-parallel
    group and FSDP over a dp x cp mesh are the whole world too)."""
    return scenario.cluster.gpus


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
    return 2 * min(DS_STAGE3_MAX_LIVE, layer_parameter_count(arch) + DS_STAGE3_PREFETCH)


def fsdp2_gathered_bytes(arch: ModelArch, n_params: int, zero_stage: int) -> float:
    """FSDP2 all-gathers bf16 weights per layer: without resharding after forward (ZeRO < 3)
    they stay gathered until backward, i.e. the whole model; with it, the layer in use and
    the next one it prefetches."""
    return 2.0 * (n_params if zero_stage < 3 else 2 * layer_parameter_count(arch))


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


def layer_activation_bytes_per_token(arch: ModelArch, scheme: Scheme) -> int:
    """Tensors one HF Llama decoder layer saves for backward, per token, excluding its input.

    Counted from the HF implementation (RMSNorm computes in fp32; SDPA/flash attention
    saves q, k, v, the output and a per-row logsumexp, no s x s matrix; GQA k and v at
    their kv width; the SwiGLU MLP at its real intermediate size i). With h = hidden,
    kv = kv_heads x head_dim:

    deepspeed (bf16 activations): 22h + 4kv + 8i
      each RMSNorm 8h (fp32 copy of its input 4h, bf16 normalised 2h, bf16 output 2h);
      attention 6h + 4kv (q after RoPE 2h, k, v 2kv each, SDPA output 2h, contiguous
      o_proj input 2h); MLP 8i (gate, silu(gate), up, and their product, 2i each).
    amp (autocast, fp32 residual): 28h + 4kv + 8i
      RMSNorm on the fp32 stream saves its fp32 product 4h, and every projection saves its
      own bf16 cast of the fp32 norm output (3 x 2h for q/k/v, 2 x 2h for gate/up); RoPE
      with fp32 cos/sin promotes q, k to fp32, which SDPA casts back to bf16; the second
      norm also saves its fp32 input 4h (the first norm's input is the layer input).
    fp32: 36h + 8kv + 16i (the deepspeed tensors at 4 bytes, norms 12h each)."""
    h, i = arch.hidden_size, arch.intermediate_size
    kv = arch.num_key_value_heads * arch.head_dim
    if scheme in ("deepspeed", "fsdp2"):
        return 22 * h + 4 * kv + 8 * i
    if scheme == "amp":
        norm1 = 4 * h + 3 * 2 * h
        attention = 2 * h + 2 * kv + 2 * kv + 2 * h + 2 * h
        norm2 = 4 * h + 4 * h + 2 * 2 * h
        mlp = 8 * i
        return norm1 + attention + norm2 + mlp  # 28h + 4kv + 8i
    return 36 * h + 8 * kv + 16 * i


def backward_temporaries_bytes_per_token(arch: ModelArch, scheme: Scheme) -> int:
    """Gradients in flight while one layer is back-propagated: the residual-stream gradient
    coming in and going out (fp32 under amp/fp32, bf16 under DeepSpeed) and two gradients
    of the MLP intermediate."""
    h, i = arch.hidden_size, arch.intermediate_size
    g = 2 if scheme in ("deepspeed", "fsdp2") else 4
    a = 4 if scheme == "fp32" else 2
    return 2 * g * h + 2 * a * i


def stored_activations_bytes(arch: ModelArch, scheme: Scheme, tokens: int, checkpointing: bool) -> float:
    """Activations held from the forward pass until backward reaches them: every layer's
    input with checkpointing, every layer's saved tensors (input included) without."""
    L = arch.num_hidden_layers
    per_layer = layer_input_bytes_per_token(arch, scheme)
    if not checkpointing:
        per_layer += layer_activation_bytes_per_token(arch, scheme)
    return float(L * per_layer * tokens)


def layer_working_bytes(arch: ModelArch, scheme: Scheme, tokens: int, checkpointing: bool) -> float:
    """Extra memory while one layer is back-propagated: with checkpointing, that layer's
    recomputed activations (and, under amp, the bf16 copies of its weights autocast makes
    again) plus the gradient temporaries; without, just the temporaries."""
    per_token = backward_temporaries_bytes_per_token(arch, scheme)
    extra = 0.0
    if checkpointing:
        per_token += layer_activation_bytes_per_token(arch, scheme)
        if scheme == "amp":
            extra = 2.0 * layer_parameter_count(arch)
    return per_token * tokens + extra


def logits_bytes(arch: ModelArch, scheme: Scheme, tokens: int) -> float:
    """The LM head's output for the local tokens and the loss on it: bf16 logits (2 bytes,
    kept by the model output), their fp32 upcast for the cross-entropy (4; log-softmax
    saves an fp32 tensor of the same size) and the fp32 gradient (4) = 10 bytes per token
    per vocabulary entry; 12 without mixed precision (fp32 logits)."""
    per = 12 if scheme == "fp32" else 10
    return float(per * tokens * arch.vocab_size)


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
    temp = {"fused": 0.0, "foreach": 4.0 * stepped, "for-loop": 4.0 * arch.vocab_size * arch.hidden_size}[impl]
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
        total += 2 * 4 * layer_parameter_count(scenario.arch)
    elif scheme == "deepspeed":
        if scenario.zero_stage >= 3:
            total += 2 * min(DS_REDUCE_BUCKET, n_params)
        elif scenario.zero_stage >= 1:
            total += 2 * 2 * (min(DS_REDUCE_BUCKET, n_params) + min(DS_ALLGATHER_BUCKET, n_params))
    return total


# ---------------------------------------------------------------------------------------


def gpu_memory_for(name: str | None) -> float | None:
    """GiB of a GPU by (part of) its name, e.g. 'NVIDIA H200' or 'A100-SXM4-80GB'; None if unknown."""
    gpu = gpus.lookup(name)
    return gpu.memory_gib if gpu else None


def phases(scheme: Scheme, resident: float, grads: float, cache: float, stored: float, working: float,
           logits: float, step_temporaries: float) -> dict[Phase, float]:
    """Peak bytes of each phase of a step.

    forward (at the loss): resident states + every stored activation + the logits, plus
    autocast's weight cache (amp). DeepSpeed's and FSDP2's gradient buffers are resident all step.
    backward: resident states + stored activations + one layer's working set. Under
    amp/fp32 the gradients are allocated as backward goes while the stored activations are
    released layer by layer, so the larger of the two counts (start or end of backward).
    optimizer step: the activations are gone; resident states + every gradient + the
    step's temporaries."""
    if scheme in ("deepspeed", "fsdp2"):
        forward = resident + grads + stored + logits
        backward = resident + grads + stored + working
    else:
        forward = resident + cache + stored + logits
        backward = resident + max(stored, grads) + working
    return {"forward": forward, "backward": backward, "optimizer step": resident + grads + step_temporaries}


def estimate(
    scenario: Scenario,
    *,
    gpu_memory_gib: float | None = None,
    declared: MemoryScheme | None = None,
    settings_mode: SettingsMode = "matched",
    gpu: str | None = None,
    scheme: Scheme | None = None,
    optimizer_impl: OptimizerImpl | None = None,
    ddp_wrapped: bool | None = None,
) -> MemoryEstimate:
    """Per-GPU peak memory of `scenario` trained by a backend that declares `declared`
    (`BackendInfo.memory`; None: the common case, fused AdamW) in `settings_mode`.
    `gpu_memory_gib` (e.g. `Machine.gpu_memory_gib`) wins over `gpu`, a device name looked
    up in the GPU table (`measure/gpus.py`); with neither, `fits` is None. `scheme` overrides the precision
    scheme (`scheme_for`); `optimizer_impl` and `ddp_wrapped`, what a run recorded, override
    what the declaration and the scenario imply."""
    arch = scenario.arch
    declared = declared or MemoryScheme()
    sch: Scheme = scheme or scheme_for(scenario, declared)
    impl = optimizer_impl or declared.optimizer_impl(scenario, settings_mode)
    wrapped = ddp_wraps(scenario, sch) if ddp_wrapped is None else ddp_wrapped
    n = parameter_count(arch)
    group = sharding_group(scenario)
    zero = scenario.zero_stage
    shard = 3 if sch == "fsdp2" else zero  # FSDP2 shards params, grads and states at every stage
    tokens = scenario.tokens_per_gpu_micro_batch
    ckpt = scenario.activation_checkpointing

    if sch in ("lora", "qlora"):
        terms, peaks = adapter_phases(scenario, impl, wrapped)
        params, grads, optim, gathered, cache, stored, working, logits, temporaries, buckets, overhead = (
            terms[k] for k in ("params", "grads", "optim", "gathered", "cache", "stored", "working", "logits",
                               "temporaries", "buckets", "overhead"))
    else:
        params = parameters_bytes(n, sch, shard, group)
        grads = gradients_bytes(n, sch, shard, group)
        optim = optimizer_states_bytes(n, sch, shard, group)
        gathered = (gathered_parameters_bytes(arch, zero) if sch == "deepspeed"
                    else fsdp2_gathered_bytes(arch, n, zero) if sch == "fsdp2" else 0.0)
        cache = weight_cache_bytes(n, sch)
        stored = stored_activations_bytes(arch, sch, tokens, ckpt)
        working = layer_working_bytes(arch, sch, tokens, ckpt)
        logits = logits_bytes(arch, sch, tokens)
        temporaries = optimizer_temporaries_bytes(arch, n, sch, impl, group if shard >= 1 else 1)
        buckets = ddp_buckets_bytes(n, sch, wrapped)
        overhead = overhead_bytes(scenario, sch, n)
        resident = params + optim + gathered + buckets + overhead
        peaks = phases(sch, resident, grads, cache, stored, working, logits, temporaries)
    peak_phase = max(peaks, key=peaks.__getitem__)
    total = peaks[peak_phase]

    mem = gpu_memory_gib if gpu_memory_gib is not None else gpu_memory_for(gpu)
    g = lambda b: round(b / GIB, 3)  # noqa: E731
    return MemoryEstimate(
        scenario=scenario.name,
        scheme=sch,
        optimizer_impl=impl,
        ddp_wrapped=wrapped,
        zero_stage=zero,
        world_size=scenario.cluster.gpus,
        sharding_group=group,
        local_tokens=tokens,
        activation_checkpointing=ckpt,
        parameters_gib=g(params),
        gradients_gib=g(grads),
        optimizer_states_gib=g(optim),
        gathered_parameters_gib=g(gathered),
        weight_cache_gib=g(cache),
        stored_activations_gib=g(stored),
        layer_working_gib=g(working),
        activations_gib=g(stored + working),
        logits_gib=g(logits),
        optimizer_temporaries_gib=g(temporaries),
        ddp_buckets_gib=g(buckets),
        overhead_gib=g(overhead),
        forward_peak_gib=g(peaks["forward"]),
        backward_peak_gib=g(peaks["backward"]),
        step_peak_gib=g(peaks["optimizer step"]),
        peak_phase=peak_phase,
        total_gib=g(total),
        gpu_memory_gib=mem,
        fits=None if mem is None else total / GIB <= mem,
    )
