"""Per-GPU memory fit-check: will a scenario's training step fit on a GPU?

Pure arithmetic on the scenario and its architecture (no torch). The terms, in bytes per GPU,
are `memory_terms.py`'s; they do not all live at once, so the estimate is the peak over three
moments of a step (`phases`): the end of the forward pass (every stored activation and the
logits), the backward pass (stored activations, one layer's recompute working set and the
gradients) and the optimizer step (no activations; states, gradients and the step's
temporaries). Their sum over-estimates measured peaks (docs/calibration.md).

What differs between backends enters only through what they declare (`MemoryScheme`,
`BackendInfo.memory`: their AdamW implementation per settings mode, the engine of their
sequence parallel) or what a run recorded (`optimizer_impl`, `ddp_wrapped`): no term here
is keyed on a backend's name.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from framework_bench.measure import gpus
from framework_bench.measure.memory_terms import (
    DTYPE_BYTES, GIB, Scheme, adapter_activation_bytes_per_token, adapter_optimizer_temporaries_bytes,
    ddp_buckets_bytes, frozen_base_bytes, fsdp2_gathered_bytes, gathered_parameters_bytes, gradients_bytes,
    layer_working_bytes, logits_bytes, optimizer_states_bytes, optimizer_temporaries_bytes, overhead_bytes,
    parameters_bytes, stored_activations_bytes, tiled_head_bytes, weight_cache_bytes)
from framework_bench.plugins.contract import MemoryScheme, OptimizerImpl
from framework_bench.scenario.models import ModelArch, parameter_count
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.job import SettingsMode

Phase = Literal["forward", "backward", "optimizer step"]


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
    logits_gib: float  # the LM head's logits, or its tiles when the backend declares `lm_head_tile`
    lm_head_tiled: bool = False
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
        head = self.breakdown()
        if self.gpu_memory_gib is None:
            return head + ", GPU memory unknown"
        verdict = "fits" if self.fits else "does NOT fit"
        return f"{head} {verdict} in {self.gpu_memory_gib:.1f} GiB"

    def breakdown(self) -> str:
        """The peak, its phase and every term: the summary without its verdict."""
        terms = (
            f"params {self.parameters_gib:.1f} + grads {self.gradients_gib:.1f} + "
            f"optim {self.optimizer_states_gib:.1f}"
            + (f" + gathered {self.gathered_parameters_gib:.1f}" if self.gathered_parameters_gib else "")
            + (f" + autocast cache {self.weight_cache_gib:.1f}" if self.weight_cache_gib else "")
            + (f" + DDP buckets {self.ddp_buckets_gib:.1f}" if self.ddp_buckets_gib else "")
            + f", activations {self.activations_gib:.1f}, "
            + (f"LM head tiles {self.logits_gib:.1f}, " if self.lm_head_tiled else f"logits {self.logits_gib:.1f}, ")
            + f"step temporaries {self.optimizer_temporaries_gib:.1f} ({self.optimizer_impl} AdamW), "
            f"overhead {self.overhead_gib:.1f}"
        )
        return (
            f"~{self.total_gib:.1f} GiB per GPU at the {self.peak_phase} ({self.phases_line()}; {self.scheme}, "
            f"ZeRO-{self.zero_stage} over {self.sharding_group}, {self.local_tokens} tokens/GPU; {terms})"
        )

    def fit_line(self, gpu: str) -> str:
        """The answer to `--gpu`: 'fits on H200 (140.4 GiB): ~115.6 GiB per GPU, 24.8 GiB to spare',
        or 'does not fit on A100-40G (40 GiB) by 75.6 GiB'. The margin is taken between the figures
        shown, so that they add up."""
        have, need = round(self.gpu_memory_gib, 1), round(self.total_gib, 1)
        if self.fits:
            return f"fits on {gpu} ({have:g} GiB): ~{need:.1f} GiB per GPU, {max(have - need, 0):.1f} GiB to spare"
        return f"does not fit on {gpu} ({have:g} GiB) by {max(need - have, 0.1):.1f} GiB"


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


def activation_scheme(scenario: Scenario) -> Scheme:
    """The full fine-tuning scheme whose activations a LoRA/QLoRA step holds: fp32 without mixed
    precision; an fp32 base (or compute dtype) under bf16 autocast, amp; else bf16, deepspeed's."""
    ft = scenario.finetune
    dtype = ft.base_dtype if ft.method == "lora" else ft.compute_dtype
    if scenario.precision == "fp32":
        return "fp32"
    return "amp" if dtype == "fp32" else "deepspeed"


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


# ---------------------------------------------------------------------------------------
# The step's phases


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


def head_bytes(arch: ModelArch, scheme: Scheme, tokens: int, declared: MemoryScheme, head_trained: bool) -> float:
    """The LM head's loss: the full logits, or the tiles of a head that never holds them whole."""
    if declared.lm_head_tile is None:
        return logits_bytes(arch, scheme, tokens)
    return tiled_head_bytes(arch, scheme, tokens, declared.lm_head_tile, head_trained)


def adapter_phases(scenario: Scenario, impl: OptimizerImpl, wrapped: bool,
                   declared: MemoryScheme) -> tuple[dict[str, float], dict[Phase, float]]:
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
        "logits": head_bytes(arch, act, tokens, declared, head_trained=False),
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
# The estimate


def gpu_memory_for(name: str | None) -> float | None:
    """GiB of a GPU by (part of) its name, e.g. 'NVIDIA H200' or 'A100-SXM4-80GB'; None if unknown."""
    gpu = gpus.lookup(name)
    return gpu.memory_gib if gpu else None


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
        terms, peaks = adapter_phases(scenario, impl, wrapped, declared)
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
        logits = head_bytes(arch, sch, tokens, declared, head_trained=True)
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
        lm_head_tiled=declared.lm_head_tile is not None,
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
