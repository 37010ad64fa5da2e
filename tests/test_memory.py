"""The per-GPU memory fit-check against measured peaks and the published scenarios."""

from __future__ import annotations

import pytest

from pathlib import Path

from framework_bench.measure import memory, memory_terms
from framework_bench.plugins import registry as plugins
from framework_bench.measure.memory import GIB, estimate, gpu_memory_for
from framework_bench.scenario.models import parameter_count
from framework_bench.scenario.scenario import Scenario, load, load_all

# Measured peaks, ../shared/notes/backend-facts.md: plain PyTorch on one H200, random-init
# Llama2-7B, batch 1, bf16 autocast over fp32 parameters, gradient checkpointing, SDPA,
# fused AdamW. The estimator reproduces both within 3.0%; the test allows 5%.
H200_PEAKS_GIB = {8192: 102.0, 32768: 117.0}
TOLERANCE = 0.05
A100_80GB = "A100-SXM4-80GB"


def make(**fields) -> Scenario:
    base = dict(
        name="t",
        model={"preset": "llama2-7b"},
        cluster={"nodes": 1, "gpus_per_node": 1, "device": "cuda"},
        context_length=8192,
        extend_positions=True,
        zero_stage=0,
        activation_checkpointing=True,
        precision="bf16",
    )
    return Scenario.model_validate(base | fields)


@pytest.mark.parametrize("ctx", sorted(H200_PEAKS_GIB))
def test_reproduces_measured_h200_peaks(ctx):
    e = estimate(make(context_length=ctx), gpu="NVIDIA H200")
    measured = H200_PEAKS_GIB[ctx]
    error = (e.total_gib - measured) / measured
    print(f"\n{ctx} tokens: estimate {e.total_gib:.1f} GiB vs measured {measured} GiB: {error:+.1%} ({e.peak_phase} peak)")
    assert e.scheme == "amp"  # autocast keeps fp32 parameters: 4 + 4 + 8 bytes/param
    assert abs(error) <= TOLERANCE
    assert e.fits is True


# Measured on one H200, Llama2-7B random init, batch 1, bf16 autocast over fp32 weights, SDPA,
# activation checkpointing, no DDP: measured peak GiB by (backend, context), with the AdamW
# each ran (plain PyTorch and LLaMA-Factory fused, XTuner foreach: its native mode now) and
# the settings mode whose declared table row is that AdamW. The estimate may be at most 3%
# under a peak (an under-estimate launches an out-of-memory run) and 8% over.
ONE_H200_PEAKS = [("torch", "matched", "fused", 8192, 102.0), ("torch", "matched", "fused", 32768, 117.0),
                 ("llamafactory", "matched", "fused", 8192, 102.0), ("llamafactory", "matched", "fused", 32768, 115.0),
                 ("xtuner", "native", "foreach", 8192, 126.0), ("xtuner", "native", "foreach", 32768, 126.0)]


@pytest.mark.parametrize("backend, mode, impl, ctx, measured", ONE_H200_PEAKS)
def test_one_gpu_7b_estimates_within_bounds_of_the_measured_peaks(backend, mode, impl, ctx, measured):
    e = estimate(make(context_length=ctx), gpu="NVIDIA H200", declared=declared(backend), settings_mode=mode)
    error = (e.total_gib - measured) / measured
    print(f"\n{backend} {ctx}: estimate {e.total_gib:.1f} GiB vs measured {measured} GiB: {error:+.1%} "
          f"({e.peak_phase}; {e.phases_line()})")
    assert e.optimizer_impl == impl and e.ddp_wrapped is False
    assert -0.03 <= error <= 0.08
    assert e.fits is True
    # the same figure from what such a run records
    assert estimate(make(context_length=ctx), optimizer_impl=impl, ddp_wrapped=False).total_gib == e.total_gib


def test_foreach_adamw_peaks_at_the_optimizer_step():
    """foreach AdamW's sqrt(v) temporary is parameter-sized: 5 x 25 GiB of fp32 at the step."""
    e = estimate(make(context_length=8192), optimizer_impl="foreach")
    n = parameter_count(make().arch)
    assert e.peak_phase == "optimizer step" and e.optimizer_temporaries_gib == pytest.approx(4 * n / GIB, rel=1e-3)
    assert e.step_peak_gib == pytest.approx(5 * 4 * n / GIB + e.overhead_gib, rel=1e-3)
    assert estimate(make(context_length=8192), optimizer_impl="fused").optimizer_temporaries_gib == 0


def test_fit_check_refuses_a_ddp_wrapped_world_of_one_naming_the_phase():
    """What XTuner once did on one H200: DDP around one process (a bucket copy of
    every gradient) plus foreach AdamW: ~6 x 25 GiB at the step, out of memory at 8k and 32k."""
    from framework_bench.run.refusals import fit_refusal

    for ctx in (8192, 32768):
        e = estimate(make(context_length=ctx), gpu="NVIDIA H200", optimizer_impl="foreach", ddp_wrapped=True)
        assert e.fits is False and e.peak_phase == "optimizer step" and e.ddp_buckets_gib > 25
        assert e.total_gib > 150
        reason = fit_refusal(e, "NVIDIA H200")
        assert reason.startswith("the optimizer step would not fit on NVIDIA H200")
        assert "DDP buckets" in reason and "foreach AdamW" in reason


def test_ddp_wraps_several_processes_without_zero_only():
    several = make(cluster={"nodes": 1, "gpus_per_node": 8})
    assert estimate(several).ddp_wrapped is True and estimate(several).ddp_buckets_gib > 0
    assert estimate(make()).ddp_wrapped is False
    assert estimate(make(cluster={"nodes": 1, "gpus_per_node": 8}, zero_stage=1)).ddp_wrapped is False


def test_h200_peak_phases():
    """With fused AdamW, 8k peaks at the end of backward (all fp32 gradients); 32k at the
    loss (autocast's bf16 weight cache + 32 fp32 layer inputs + logits)."""
    assert estimate(make(context_length=8192)).peak_phase == "backward"
    assert estimate(make(context_length=32768)).peak_phase == "forward"


def test_adamw_bytes_per_param_on_one_gpu():
    n = parameter_count(make().arch)
    assert 6.7e9 < n < 6.8e9  # Llama2-7B
    amp = estimate(make())
    ds = estimate(make(), scheme="deepspeed")
    for e, per in ((amp, (4, 4, 8)), (ds, (2, 2, 12))):
        got = (e.parameters_gib, e.gradients_gib, e.optimizer_states_gib)
        assert got == pytest.approx(tuple(p * n / GIB for p in per), rel=1e-3)
    # both 16 bytes/param in total
    assert sum((amp.parameters_gib, amp.gradients_gib, amp.optimizer_states_gib)) == pytest.approx(
        sum((ds.parameters_gib, ds.gradients_gib, ds.optimizer_states_gib)), rel=1e-3
    )
    assert amp.weight_cache_gib == pytest.approx(2 * n / GIB, rel=1e-3) and ds.weight_cache_gib == 0


def test_llama2_70b_8k_needs_zero3_across_many_gpus():
    one_gpu = make(model={"preset": "llama2-70b"}, context_length=8192)
    assert estimate(one_gpu, gpu_memory_gib=80).fits is False
    # even ZeRO-3 over one node of 8 does not: 16 bytes x 69B / 8 = 128 GiB of states
    one_node = make(model={"preset": "llama2-70b"}, cluster={"nodes": 1, "gpus_per_node": 8}, zero_stage=3)
    assert estimate(one_node, gpu_memory_gib=80).fits is False
    published = load("llama2_70b_8k")
    assert published.cluster.gpus == 32 and published.zero_stage == 3
    e = estimate(published, gpu_memory_gib=80)
    assert e.fits is True
    assert e.total_gib < 70


PUBLISHED = [s for s in load_all() if s.reference is not None]


def declared(backend: str) -> memory.MemoryScheme:
    return plugins.get(backend).info.memory


@pytest.mark.parametrize("mode", ["matched", "native"])
@pytest.mark.parametrize("backend", ["xtuner", "llamafactory"])
@pytest.mark.parametrize("scenario", PUBLISHED, ids=lambda s: s.name)
def test_every_published_scenario_fits_on_its_a100(scenario, backend, mode):
    assert scenario.reference.hardware == A100_80GB
    e = estimate(scenario, gpu=scenario.reference.hardware, declared=declared(backend), settings_mode=mode)
    print(f"\n{scenario.name} ({backend}, {mode}): {e.summary()}")
    assert e.gpu_memory_gib == 80.0
    assert e.fits is True
    # LLaMA-Factory declares its sequence parallel on its v1 trainer (FSDP2), the rest run on DeepSpeed
    lf_v1 = backend == "llamafactory" and scenario.sequence_parallel > 1
    assert e.scheme == ("fsdp2" if lf_v1 else "deepspeed")
    assert e.ddp_wrapped is False  # ZeRO or FSDP2: no DDP


@pytest.mark.parametrize("scenario", [s for s in PUBLISHED if s.sequence_parallel > 1], ids=lambda s: s.name)
def test_sequence_parallel_engines_as_the_backends_declare_them(scenario):
    """LLaMA-Factory's SP modelled as its v1 FSDP2 trainer (fp32 params, grads and Adam states
    sharded over the world: 16 bytes/param / world, its own foreach AdamW), XTuner's as DeepSpeed."""
    v1 = estimate(scenario, declared=declared("llamafactory"))
    n, world = parameter_count(scenario.arch), scenario.cluster.gpus
    assert v1.scheme == "fsdp2" and v1.optimizer_impl == "foreach"
    assert v1.parameters_gib + v1.gradients_gib + v1.optimizer_states_gib == pytest.approx(16 * n / world / GIB, rel=1e-3)
    assert v1.optimizer_temporaries_gib == pytest.approx(4 * n / world / GIB, rel=1e-3)
    assert estimate(scenario, declared=declared("xtuner")).scheme == "deepspeed"


def test_a_declared_lm_head_tile_replaces_the_logits_by_one_tile_and_the_heads_fp32_gradients():
    """A backend whose loss projects the head in tiles (TRL's fused head) never holds the
    (tokens x vocabulary) logits: at 8k on Llama2-7B its estimate is lower by exactly that."""
    s = make(context_length=8192)
    full, tiled = estimate(s, declared=declared("torch")), estimate(s, declared=declared("trl"))
    tile_t, tile_v = plugins.get("trl").info.memory.lm_head_tile
    tokens, vocab, hidden = 8192, s.arch.vocab_size, s.arch.hidden_size
    assert full.logits_gib == pytest.approx(10 * tokens * vocab / GIB, abs=1e-3)
    by_hand = 2 * min(tile_t, tokens) * min(tile_v, vocab) + 32 * tokens + 4 * tokens * hidden + 4 * vocab * hidden
    assert tiled.logits_gib == pytest.approx(by_hand / GIB, abs=1e-3)
    assert tiled.forward_peak_gib == pytest.approx(full.forward_peak_gib - full.logits_gib + tiled.logits_gib, abs=2e-3)
    assert "LM head tiles" in tiled.breakdown() and "LM head tiles" not in full.breakdown()
    # adapters: the frozen head accumulates no fp32 gradient of its weight
    lora = make(context_length=8192, finetune={"method": "lora", "rank": 8, "alpha": 16, "targets": "all-linear"})
    assert estimate(lora, declared=declared("trl")).logits_gib == pytest.approx((by_hand - 4 * vocab * hidden) / GIB, abs=1e-3)


def test_no_backend_name_in_the_memory_model():
    """What differs between backends comes from their declarations and recorded settings."""
    text = "".join(Path(m.__file__).read_text().lower() for m in (memory, memory_terms))
    for name in [*plugins.backends(), "llama-factory", "mmengine", "hf trainer"]:
        if name != "torch":  # also the library every term is about
            assert name.lower() not in text, name


def test_published_scenarios_are_not_trivially_small():
    """The check must have teeth: the longest rows use a good share of the 80 GB."""
    totals = {s.name: estimate(s).total_gib for s in PUBLISHED}
    assert len(totals) == 14
    assert max(totals.values()) > 50
    assert totals["yi34b_256k"] > totals["yi34b_128k"]


def test_checkpointing_off_uses_more():
    on = estimate(make(context_length=8192))
    off = estimate(make(context_length=8192, activation_checkpointing=False))
    assert off.stored_activations_gib > 10 * on.stored_activations_gib
    assert off.activations_gib > on.activations_gib
    assert off.total_gib > on.total_gib
    for zero in (1, 3):
        kw = dict(cluster={"nodes": 1, "gpus_per_node": 8}, zero_stage=zero)
        assert estimate(make(activation_checkpointing=False, **kw)).total_gib > estimate(make(**kw)).total_gib


def test_sequence_parallel_divides_activations():
    kw = dict(cluster={"nodes": 1, "gpus_per_node": 8}, zero_stage=3, context_length=131072)
    sp1 = estimate(make(sequence_parallel=1, **kw))
    sp8 = estimate(make(sequence_parallel=8, **kw))
    assert sp8.local_tokens == sp1.local_tokens // 8
    assert sp8.stored_activations_gib == pytest.approx(sp1.stored_activations_gib / 8, rel=1e-3)
    assert sp8.logits_gib == pytest.approx(sp1.logits_gib / 8, rel=1e-3)
    assert sp8.layer_working_gib < sp1.layer_working_gib / 7
    # the states are sharded over the whole world either way
    assert sp8.sharding_group == sp1.sharding_group == 8
    assert sp8.optimizer_states_gib == sp1.optimizer_states_gib
    assert sp8.total_gib < sp1.total_gib


def test_zero_stages_shrink_the_right_terms_in_order():
    kw = dict(model={"preset": "llama2-70b"}, cluster={"nodes": 4, "gpus_per_node": 8})
    e = {z: estimate(make(zero_stage=z, **kw), scheme="deepspeed") for z in (0, 1, 2, 3)}
    n = parameter_count(make(**kw).arch)
    # stage 1 shards the optimizer states
    assert e[1].optimizer_states_gib == pytest.approx(e[0].optimizer_states_gib / 32, rel=1e-3)
    assert e[1].gradients_gib == e[0].gradients_gib and e[1].parameters_gib == e[0].parameters_gib
    # stage 2 adds the gradients
    assert e[2].gradients_gib == pytest.approx(e[1].gradients_gib / 32, rel=1e-3)
    assert e[2].optimizer_states_gib == e[1].optimizer_states_gib and e[2].parameters_gib == e[1].parameters_gib
    # stage 3 adds the parameters (and gathers one layer's worth at a time)
    assert e[3].parameters_gib == pytest.approx(2 * n / 32 / GIB, rel=1e-3)
    assert e[3].gradients_gib == e[2].gradients_gib and e[3].optimizer_states_gib == e[2].optimizer_states_gib
    assert 0 < e[3].gathered_parameters_gib < e[2].parameters_gib / 10
    assert e[0].total_gib > e[1].total_gib > e[2].total_gib > e[3].total_gib
    # default scheme: no ZeRO means autocast over fp32 params, bigger still
    assert estimate(make(zero_stage=0, **kw)).total_gib > e[0].total_gib


@pytest.mark.parametrize("preset", ["llama2-7b", "llama2-70b", "yi-34b-200k"])
@pytest.mark.parametrize("zero", [0, 3])
def test_monotonic_in_context_length(preset, zero):
    totals = [
        estimate(make(model={"preset": preset}, cluster={"nodes": 4, "gpus_per_node": 8}, zero_stage=zero,
                      context_length=2**k)).total_gib
        for k in range(10, 21)
    ]
    # never decreasing; flat only while the optimizer step (no activations) is the peak
    assert all(a <= b for a, b in zip(totals, totals[1:])), totals
    assert totals[-1] > 2 * totals[0]


def test_per_token_per_layer_bytes():
    arch = make().arch  # h 4096, kv 4096, i 11008
    assert memory_terms.layer_activation_bytes_per_token(arch, "deepspeed") == 22 * 4096 + 4 * 4096 + 8 * 11008
    assert memory_terms.layer_activation_bytes_per_token(arch, "amp") == 28 * 4096 + 4 * 4096 + 8 * 11008
    gqa = make(model={"preset": "llama2-70b"}).arch  # kv = 8 x 128 = 1024
    assert memory_terms.layer_activation_bytes_per_token(gqa, "deepspeed") == 22 * 8192 + 4 * 1024 + 8 * 28672
    # no s^2 term: per token it does not depend on the context length
    a = estimate(make(context_length=8192, activation_checkpointing=False))
    b = estimate(make(context_length=65536, activation_checkpointing=False))
    assert b.stored_activations_gib == pytest.approx(8 * a.stored_activations_gib, rel=1e-6)


def test_gpu_memory_lookup_and_fits():
    assert gpu_memory_for("NVIDIA A100-SXM4-80GB") == 80.0
    assert gpu_memory_for("NVIDIA H100 80GB HBM3") == pytest.approx(79.6)
    assert gpu_memory_for("NVIDIA H200") == pytest.approx(140.4)
    assert gpu_memory_for("NVIDIA A100-SXM4-40GB") == 40.0
    assert gpu_memory_for("Tesla T4") is None and gpu_memory_for(None) is None
    s = make()
    unknown = estimate(s)
    assert unknown.fits is None and unknown.gpu_memory_gib is None
    assert "unknown" in unknown.summary()
    assert estimate(s, gpu="NVIDIA A100-SXM4-80GB").fits is False  # 16 bytes x 6.7B > 80 GiB
    assert estimate(s, gpu="A100-SXM4-80GB", gpu_memory_gib=200).fits is True  # a given figure wins
    line = estimate(s, gpu_memory_gib=80).summary()
    assert "\n" not in line and "does NOT fit" in line


def test_tiny_cpu_scenarios_are_small():
    for name in ("tiny_cpu", "tiny_cpu_4k"):
        e = estimate(load(name))
        assert e.scheme == "fp32"
        assert e.total_gib < 3


# ---------------------------------------------------------------------------------------
# LoRA / QLoRA: a frozen base with adapters


def test_four_bit_weights_with_their_block_scales():
    # half a byte, plus a 64-block's fp32 absmax; double quant: an 8-bit absmax and an fp32 scale per 256 blocks
    assert memory_terms.four_bit_bytes_per_param(False) == 0.5 + 4 / 64
    assert memory_terms.four_bit_bytes_per_param(True) == 0.5 + 1 / 64 + 4 / (64 * 256)


def test_frozen_base_by_hand():
    s = load("tiny_cpu_qlora")  # 4 layers, hidden 256, kv 128, intermediate 688, vocab 512, compute fp32
    linear = 4 * (256 * 256 * 2 + 256 * 128 * 2 + 3 * 256 * 688)
    assert memory_terms.linear_parameter_count(s.arch) == linear
    rest = 2 * 512 * 256 + 4 * 2 * 256 + 256  # embeddings, head, norms
    assert parameter_count(s.arch) == linear + rest
    assert memory_terms.frozen_base_bytes(s.arch, s.finetune) == linear * (0.5 + 1 / 64 + 4 / 16384) + rest * 4
    lora = load("tiny_cpu_lora")
    assert memory_terms.frozen_base_bytes(lora.arch, lora.finetune) == 4 * (linear + rest)


def test_lora_estimate_holds_adapter_states_only():
    s = load("llama2_7b_8k_1gpu_lora")
    n_adapter = s.finetune.adapter_parameter_count(s.arch)
    e = estimate(s)
    assert e.scheme == "lora"
    # fp32 adapters: 4 bytes of weights, 4 of gradients, 8 of AdamW m and v; the bf16 base 2 bytes a weight
    assert e.gradients_gib == round(4 * n_adapter / GIB, 3)
    assert e.optimizer_states_gib == round(8 * n_adapter / GIB, 3)
    assert e.parameters_gib == round((2 * parameter_count(s.arch) + 4 * n_adapter) / GIB, 3)
    full, qlora = estimate(load("llama2_7b_8k_1gpu")), estimate(load("llama2_7b_8k_1gpu_qlora"))
    assert qlora.scheme == "qlora" and qlora.total_gib < e.total_gib < full.total_gib
    # the 4-bit base saves what its storage does, its activations are the bf16 base's
    assert e.parameters_gib - qlora.parameters_gib == pytest.approx(
        (memory_terms.frozen_base_bytes(s.arch, s.finetune) - memory_terms.frozen_base_bytes(s.arch, load(
            "llama2_7b_8k_1gpu_qlora").finetune)) / GIB, abs=2e-3)
    assert e.logits_gib == qlora.logits_gib


def test_adapters_checkpointed_or_not():
    s = load("llama2_7b_8k_1gpu_lora")
    per_layer = memory_terms.adapter_activation_bytes_per_token(s.arch, s.finetune, "deepspeed") * 8192
    # bf16 base: each target keeps its input cast to fp32 and A's fp32 output (r = 64)
    h, i = 4096, 11008
    assert per_layer == 8192 * (4 * (6 * h + i) + 7 * 4 * 64)
    stored = {ckpt: estimate(s.model_copy(update={"activation_checkpointing": ckpt})).stored_activations_gib
              for ckpt in (True, False)}
    full = {ckpt: memory_terms.stored_activations_bytes(s.arch, "deepspeed", 8192, ckpt) for ckpt in (True, False)}
    assert stored[True] == round(full[True] / GIB, 3)
    assert stored[False] == round((full[False] + 32 * per_layer) / GIB, 3)


def test_adapter_activations_with_an_fp32_base_and_with_dropout():
    s = load("tiny_cpu_lora")  # fp32, no dropout: lora_A reads the very fp32 input the base linear reads
    assert memory.activation_scheme(s) == "fp32"
    assert memory_terms.adapter_activation_bytes_per_token(s.arch, s.finetune, "fp32") == 7 * 4 * 8
    dropped = s.finetune.model_copy(update={"dropout": 0.1})
    inputs = 6 * 256 + 688  # q, k, v, o, gate, up read hidden; down reads intermediate
    # dropout's fp32 output (lora_A's input) and its 1-byte mask per input element
    assert memory_terms.adapter_activation_bytes_per_token(s.arch, dropped, "fp32") == 5 * inputs + 7 * 4 * 8
