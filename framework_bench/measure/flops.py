"""Every FLOPs and throughput figure fbench reports, for every backend, comes from here.

Two conventions, reported side by side:
- `mha_flops_per_token`: every attention projection at full multi-head size (XTuner's
  ThroughputHook formula, which the published table used), so it over-counts GQA models.
A MoE model's FLOPs, by either convention, count the experts a token is routed to (top-k, its
router, a shared expert), not every expert: the work done, which is why a MoE's tokens/s is high.
- `model_flops_per_token`: projections at their real size (GQA K/V counted with their KV
  heads), causal attention as half of the full score matrix (Megatron / torchtitan
  convention), with or without recomputation of the layers.
- `lora_flops_per_token`: `model_flops_per_token` for a frozen base with low-rank adapters
  (LoRA/QLoRA): no weight-gradient GEMMs for the frozen weights, plus the adapters' own.
Both conventions are per token of the full sequence; per GPU throughput = TGS x FLOPs per token (on CPU,
per worker process). The device ceilings these figures are held to (a GPU's dense peak from
gpus.py, a CPU's peak from cpu_peak.py) are applied in metrics.figures.
"""

from __future__ import annotations

from framework_bench.measure import gpus
from framework_bench.scenario.models import ModelArch, parameter_counts
from framework_bench.scenario.finetune import FineTune
from framework_bench.scenario.scenario import Scenario

# Dense bf16 peak, TFLOP/s, by a substring of the device name (from the one GPU table).
GPU_PEAK_TFLOPS = {key: gpu.peak_tflops for key, gpu in gpus.GPUS.items()}


def mha_flops_per_token(arch: ModelArch, seq_len: int, recompute: bool, causal: bool = True) -> float:
    """Training FLOPs per token with the attention projections counted as full multi-head
    attention at the hidden width (K and V at num_attention_heads even for a GQA model), the MLP as
    three hidden x intermediate matmuls, causal attention as half the score matrix, and the LM head.

    The formula of XTuner's ThroughputHook (xtuner/engine/hooks/throughput_hook.py), behind
    the TFLOPs of XTuner's published table: per GPU and iteration, with s = seq_len / sp and
    batch B, (3 + ckpt) * L * (8 B s h^2 + 4 B s^2 h sp / (1 + causal) + 4 r B s h^2) + 6 B s h V,
    r = 1.5 * intermediate / hidden; divided here by the B s tokens of the iteration. A MoE layer's
    MLP counts what one token runs through: its router, its top-k experts and any shared expert
    (`parameter_counts`' `moe_mlp_active`), never every expert; 4 r h^2 is 2 x a dense MLP's weights."""
    h, L, V = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    counts, n_moe = parameter_counts(arch), len(arch.moe_layers)
    mlp = (L - n_moe) * counts["dense_mlp"] + n_moe * counts["moe_mlp_active"]
    per_model = L * (8 * h * h + 4 * seq_len * h / (1 + int(causal))) + 2 * mlp
    return (3 + int(recompute)) * per_model + 6 * h * V


def model_flops_per_token(
    arch: ModelArch, seq_len: int, recompute: bool, mean_attended: float | None = None
) -> float:
    """Exact matmul FLOPs per trained token: forward x3 (forward + backward), layers x4 with
    recomputation. `mean_attended` is the mean number of keys a query sees: (seq_len + 1) / 2
    for causal attention over a packed row (the default); smaller for varlen attention. The
    linear weights are the ones a token passes through (`parameter_counts`' `active_linear`):
    in a MoE layer its router, its top-k experts and any shared expert, never every expert."""
    counts = parameter_counts(arch)
    attended = (seq_len + 1) / 2 if mean_attended is None else mean_attended
    linears = 2 * counts["active_linear"]  # q, k, v, o, the MLP or active experts: 2 FLOPs a weight
    attention = arch.num_hidden_layers * 2 * 2 * attended * arch.q_dim  # scores and weighted sum
    return (3 + int(recompute)) * (linears + attention) + 3 * 2 * counts["head_matmul"]


def lora_flops_per_token(arch: ModelArch, seq_len: int, recompute: bool, finetune: FineTune,
                         mean_attended: float | None = None) -> float:
    """Matmul FLOPs per trained token with the base frozen and adapters on `finetune.targets`.

    Derivation, beside full fine-tuning's. A linear layer y = x W (W: in x out, N = in x out
    weights) costs 2N FLOPs per token forward. Its backward is two GEMMs of the same size:
    the activation gradient dx = dy W^T (2N) and the weight gradient dW = x^T dy (2N). Full
    fine-tuning runs all three: 6N, `model_flops_per_token`'s forward x3. A frozen W needs no
    dW, but dx still flows back through it to the adapters of the layers below: 2N + 2N = 4N
    (XTuner's and every full-FT formula's 6N over-counts it by half). The adapter on a target,
    B(A(x)) with A: in x r and B: r x out, is a trained linear pair of n = r (in + out)
    weights: forward 2n, backward 4n (dx and dW for both) = 6n. Attention's scores and
    weighted sum have no weights; their backward takes gradients for both operands (q and k,
    scores and v), twice the forward, as under full fine-tuning: 3x. The LM head is frozen:
    forward and activation gradient, 4hV. With recomputation every layer's forward runs once
    more: + 2N for the base weights, + 2n for the adapters, + the attention forward. So per
    token, with N the layer's base weights, n its adapters' and a its attention forward:

        full: (3 + c) L (2N + a) + 3 (2hV)
        lora: L ((2 + c) 2N + (3 + c) 2n + (3 + c) a) + 2 (2hV)

    c = 1 with recomputation. QLoRA's dequantization of the 4-bit weights is elementwise work,
    not counted, as no elementwise work is."""
    counts = parameter_counts(arch)
    attended = (seq_len + 1) / 2 if mean_attended is None else mean_attended
    base = 2 * counts["active_linear"]
    attention = arch.num_hidden_layers * 2 * 2 * attended * arch.q_dim
    adapters = 2 * finetune.adapter_parameter_count(arch)
    c = int(recompute)
    return (2 + c) * base + (3 + c) * adapters + (3 + c) * attention + 2 * 2 * counts["head_matmul"]


def scenario_model_flops_per_token(scenario: Scenario, recompute: bool | None = None,
                                   mean_attended: float | None = None) -> float:
    """The model FLOPs per token of what the scenario trains: every weight
    (`model_flops_per_token`), or adapters on a frozen base (`lora_flops_per_token`).
    `recompute` defaults to the scenario's activation checkpointing."""
    recompute = scenario.activation_checkpointing if recompute is None else recompute
    if scenario.finetune.method == "full":
        return model_flops_per_token(scenario.arch, scenario.context_length, recompute, mean_attended)
    return lora_flops_per_token(scenario.arch, scenario.context_length, recompute, scenario.finetune, mean_attended)


def tflops(tgs: float, flops_per_token: float) -> float:
    """TFLOP/s per GPU from tokens per second per GPU."""
    return tgs * flops_per_token / 1e12


def gpu_peak_tflops(device_name: str | None) -> float | None:
    gpu = gpus.lookup(device_name)
    return gpu.peak_tflops if gpu else None


def mfu(model_tflops: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1) against a device peak; None without a known peak."""
    return model_tflops / peak_tflops if peak_tflops else None
