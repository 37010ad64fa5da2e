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
- a fixed overhead (CUDA context, allocator fragmentation, NCCL and framework buffers).

The terms do not all live at once. The total is the peak of two moments of a step
(`_phases`): the end of the forward pass (the loss: every stored activation and the
logits) and the backward pass (stored activations, one layer's recompute working set and
the gradients). Summing everything instead over-estimates the measured plain-PyTorch 7B
32k peak by ~25%; the two-phase peak reproduces both measured H200 peaks within ~3%
(tests/test_memory.py).

Precision schemes, because they differ in where the 16 bytes per parameter live:
- ``amp``: torch autocast with fp32 parameters (plain PyTorch, mmengine's AmpOptimWrapper,
  HF Trainer bf16 without DeepSpeed). fp32 params 4 + fp32 grads 4 + Adam m, v 8 = 16
  bytes/param. Autocast caches a bf16 copy of every weight during the forward pass (2
  bytes/param, freed when the autocast region ends, before backward), the residual
  stream stays fp32, and gradients are freed by `zero_grad(set_to_none=True)` between steps,
  so they only grow during backward while the stored activations are released.
- ``deepspeed``: DeepSpeed bf16: bf16 params 2 + bf16 grads 2 + fp32 master, m, v 12 =
  16 bytes/param, gradient and partition buffers resident for the whole step;
  bf16 activations.
- ``fp32``: no mixed precision: 4 + 4 + 8 bytes/param (grads freed between steps as in
  amp), fp32 activations.
- ``fsdp2``: LLaMA-Factory's v1 trainer (its only sequence-parallel path): the model is
  cast to fp32 and fully sharded over the world (FSDP2 `fully_shard`, every ZeRO stage):
  fp32 params 4 + fp32 grads 4 (reduce_dtype fp32) + Adam m, v 8 = 16 bytes/param, all
  divided by the world; bf16 compute (param_dtype bf16), so bf16 activations; gathered bf16
  weights: the whole model between forward and backward when parameters are not
  resharded after forward (ZeRO < 3), else the layer in use and the prefetched next one.
  Its sequence-parallel loss (`sequence_parallel_loss`) upcasts the bf16 logits with
  `.float()` and runs cross-entropy on that view (no further copy): 2 + 4 + 4 bytes per
  token per vocabulary entry, as `logits_bytes` counts for every scheme. Weights are built
  on global rank 0 in host memory and scattered (`init_on_rank0`): no full copy on a GPU.

Framework names: the backends' `BackendInfo.framework` ("XTuner", "LLaMA-Factory") or
their backend names ("xtuner", "llamafactory"); `framework_key` folds both to one key.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from framework_bench.models import ModelArch
from framework_bench.scenario import Scenario

GIB = 1024**3

Scheme = Literal["amp", "deepspeed", "fp32", "fsdp2"]

# GPU memory as nvidia-smi reports `memory.total` (what `machine.detect()` records), GiB.
# The estimate itself adds the CUDA context and allocator slack (`overhead_bytes`), so it
# is compared with the whole device. Matched by substring of the device name, most
# specific first.
GPU_MEMORY_GIB: dict[str, float] = {
    "A100-SXM4-80GB": 80.0,  # 81920 MiB
    "A100-PCIE-80GB": 80.0,
    "A100 80GB": 80.0,
    "A100-SXM4-40GB": 40.0,
    "A100-PCIE-40GB": 40.0,
    "A100": 40.0,  # unqualified A100: assume the smaller one
    "H100": 79.6,  # H100 80GB HBM3: 81559 MiB
    "H200": 140.4,  # 143771 MiB; ~139 GiB left to tensors after the CUDA context
}

# Fixed overheads, bytes.
CUDA_CONTEXT_BYTES = 1.0 * GIB  # CUDA context + cuBLAS/cuDNN workspaces, outside the allocator
ALLOCATOR_SLACK_BYTES = 1.0 * GIB  # caching-allocator fragmentation (reserved but unused)
NCCL_BYTES = 0.5 * GIB  # NCCL communicator buffers, only with more than one process

# DeepSpeed defaults (elements), used by the XTuner backend's config (it sets only the stage
# and overlap_comm); the LLaMA-Factory backend writes the same bucket sizes and a larger
# stage-3 prefetch bucket (5e8).
DS_REDUCE_BUCKET = 5e8
DS_ALLGATHER_BUCKET = 5e8
DS_STAGE3_PREFETCH = {"llamafactory": 5e8}
DS_STAGE3_PREFETCH_DEFAULT = 5e7
DS_STAGE3_MAX_LIVE = 1e9


class MemoryEstimate(BaseModel):
    """Per-GPU memory of one training step, GiB. `total_gib` is the peak over the forward
    and backward phases (`peak_phase`), not the sum of the terms."""

    model_config = ConfigDict(frozen=True)

    scenario: str
    framework: str | None
    scheme: Scheme
    zero_stage: int
    world_size: int
    sharding_group: int
    local_tokens: int  # micro_batch x context_length / SP: tokens one GPU holds activations for
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
    overhead_gib: float

    forward_peak_gib: float
    backward_peak_gib: float
    peak_phase: Literal["forward", "backward"]
    total_gib: float
    gpu_memory_gib: float | None = None
    fits: bool | None = None

    def summary(self) -> str:
        terms = (
            f"params {self.parameters_gib:.1f} + grads {self.gradients_gib:.1f} + "
            f"optim {self.optimizer_states_gib:.1f}"
            + (f" + gathered {self.gathered_parameters_gib:.1f}" if self.gathered_parameters_gib else "")
            + (f" + autocast cache {self.weight_cache_gib:.1f}" if self.weight_cache_gib else "")
            + f", activations {self.activations_gib:.1f}, logits {self.logits_gib:.1f}, "
            f"overhead {self.overhead_gib:.1f}"
        )
        head = (
            f"~{self.total_gib:.1f} GiB per GPU ({self.peak_phase} peak; {self.scheme}, "
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
# Scheme and sharding


def framework_key(framework: str | None) -> str | None:
    """'LLaMA-Factory' -> 'llamafactory', 'XTuner' -> 'xtuner' (lower case, letters and digits)."""
    return None if framework is None else "".join(ch for ch in framework.lower() if ch.isalnum())


def scheme_for(scenario: Scenario, framework: str | None = None) -> Scheme:
    """How the backends train this scenario: LLaMA-Factory's sequence parallel on its v1
    FSDP2 trainer; DeepSpeed for any ZeRO stage (both backends), and for XTuner's sequence
    parallel (its DeepSpeed strategy builds the SP groups); otherwise torch autocast over
    fp32 parameters (AmpOptimWrapper, HF Trainer `bf16`)."""
    framework = framework_key(framework)
    if scenario.precision == "fp32":
        return "fp32"
    if scenario.sequence_parallel > 1 and framework == "llamafactory":
        return "fsdp2"
    if scenario.zero_stage > 0:
        return "deepspeed"
    if scenario.sequence_parallel > 1 and framework in (None, "xtuner"):
        return "deepspeed"
    return "amp"


def sharding_group(scenario: Scenario) -> int:
    """Ranks a ZeRO stage partitions over: the whole world, not world / SP. XTuner builds
    its DeepSpeed engine without an mpu, so ZeRO partitions over every rank and the SP ranks
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


def gathered_parameters_bytes(arch: ModelArch, zero_stage: int, framework: str | None) -> float:
    """ZeRO-3 all-gathers full bf16 weights before each module runs: the layer in use plus
    the prefetch bucket, capped by stage3_max_live_parameters."""
    if zero_stage < 3:
        return 0.0
    prefetch = DS_STAGE3_PREFETCH.get(framework_key(framework) or "", DS_STAGE3_PREFETCH_DEFAULT)
    return 2 * min(DS_STAGE3_MAX_LIVE, layer_parameter_count(arch) + prefetch)


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
# Overhead


def overhead_bytes(
    scenario: Scenario, scheme: Scheme, n_params: int, framework: str | None
) -> float:
    """Fixed costs: CUDA context, allocator fragmentation, and with more than one process
    NCCL buffers plus the framework's communication buffers: DeepSpeed's reduce bucket
    (ZeRO-3), reduce + all-gather buckets double-buffered by overlap_comm (ZeRO-1/2), or
    DDP's gradient buckets (a second copy of the gradients) without ZeRO."""
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
    else:
        total += gradients_bytes(n_params, scheme, 0, 1)
    return total


# ---------------------------------------------------------------------------------------


def gpu_memory_for(name: str | None) -> float | None:
    """GiB of a GPU by (part of) its name, e.g. 'NVIDIA H200' or 'A100-SXM4-80GB'; None if unknown."""
    if not name:
        return None
    upper = name.upper()
    for key, gib in GPU_MEMORY_GIB.items():
        if key.upper() in upper:
            return gib
    return None


def _phases(
    scheme: Scheme, resident: float, grads: float, cache: float, stored: float, working: float, logits: float
) -> tuple[float, float]:
    """(forward peak, backward peak), bytes.

    forward (at the loss): resident states + every stored activation + the logits, plus
    autocast's weight cache (amp). DeepSpeed's gradient buffers are resident all step.
    backward: resident states + stored activations + one layer's working set. Under
    amp/fp32 the gradients are allocated as backward goes while the stored activations are
    released layer by layer, so the larger of the two counts (start or end of backward)."""
    if scheme in ("deepspeed", "fsdp2"):
        forward = resident + grads + stored + logits
        backward = resident + grads + stored + working
    else:
        forward = resident + cache + stored + logits
        backward = resident + max(stored, grads) + working
    return forward, backward


def estimate(
    scenario: Scenario,
    *,
    gpu_memory_gib: float | None = None,
    framework: str | None = None,
    gpu: str | None = None,
    scheme: Scheme | None = None,
) -> MemoryEstimate:
    """Per-GPU peak memory of `scenario` trained by `framework` ('xtuner', 'llamafactory' or
    None for the common case). `gpu_memory_gib` (e.g. `Machine.gpu_memory_gib`) wins over
    `gpu`, a device name looked up in GPU_MEMORY_GIB; with neither, `fits` is None.
    `scheme` overrides the precision scheme the backends would use (`scheme_for`)."""
    arch = scenario.arch
    sch: Scheme = scheme or scheme_for(scenario, framework)
    n = parameter_count(arch)
    group = sharding_group(scenario)
    zero = scenario.zero_stage
    shard = 3 if sch == "fsdp2" else zero  # FSDP2 shards params, grads and states at every stage
    tokens = scenario.micro_batch * scenario.context_length // scenario.sequence_parallel
    ckpt = scenario.activation_checkpointing

    params = parameters_bytes(n, sch, shard, group)
    grads = gradients_bytes(n, sch, shard, group)
    optim = optimizer_states_bytes(n, sch, shard, group)
    gathered = (gathered_parameters_bytes(arch, zero, framework) if sch == "deepspeed"
                else fsdp2_gathered_bytes(arch, n, zero) if sch == "fsdp2" else 0.0)
    cache = weight_cache_bytes(n, sch)
    stored = stored_activations_bytes(arch, sch, tokens, ckpt)
    working = layer_working_bytes(arch, sch, tokens, ckpt)
    logits = logits_bytes(arch, sch, tokens)
    overhead = overhead_bytes(scenario, sch, n, framework)

    resident = params + optim + gathered + overhead
    forward, backward = _phases(sch, resident, grads, cache, stored, working, logits)
    total = max(forward, backward)

    mem = gpu_memory_gib if gpu_memory_gib is not None else gpu_memory_for(gpu)
    g = lambda b: round(b / GIB, 3)  # noqa: E731
    return MemoryEstimate(
        scenario=scenario.name,
        framework=framework,
        scheme=sch,
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
        overhead_gib=g(overhead),
        forward_peak_gib=g(forward),
        backward_peak_gib=g(backward),
        peak_phase="forward" if forward >= backward else "backward",
        total_gib=g(total),
        gpu_memory_gib=mem,
        fits=None if mem is None else total / GIB <= mem,
    )
