"""Every FLOPs and throughput figure fbench reports, for every backend, comes from here.

Two conventions, reported side by side:
- `mha_flops_per_token`: every attention projection at full multi-head size (XTuner's
  ThroughputHook formula, which the published table used), so it over-counts GQA models.
- `model_flops_per_token`: projections at their real size (GQA K/V counted with their KV
  heads), causal attention as half of the full score matrix (Megatron / torchtitan
  convention), with or without recomputation of the layers.
Both are per token of the full sequence; per GPU throughput = TGS x FLOPs per token (on CPU,
per worker process). The device ceilings these figures are held to (a GPU's dense peak from
gpus.py, a CPU's peak from cpu_peak.py) are applied in metrics.figures.
"""

from __future__ import annotations

from framework_bench.measure import gpus
from framework_bench.spec.models import ModelArch

# Dense bf16 peak, TFLOP/s, by a substring of the device name (from the one GPU table).
GPU_PEAK_TFLOPS = {key: gpu.peak_tflops for key, gpu in gpus.GPUS.items()}


def mha_flops_per_token(arch: ModelArch, seq_len: int, recompute: bool, causal: bool = True) -> float:
    """Training FLOPs per token with the attention projections counted as full multi-head
    attention (K and V at num_attention_heads even for a GQA model), the MLP as three
    hidden x intermediate matmuls, causal attention as half the score matrix, and the LM head.

    The formula of XTuner's ThroughputHook (xtuner/engine/hooks/throughput_hook.py), behind
    the TFLOPs of XTuner's published table: per GPU and iteration, with s = seq_len / sp and
    batch B, (3 + ckpt) * L * (8 B s h^2 + 4 B s^2 h sp / (1 + causal) + 4 r B s h^2) + 6 B s h V,
    r = 1.5 * intermediate / hidden; divided here by the B s tokens of the iteration."""
    h, L, V = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    r = 1.5 * arch.intermediate_size / h
    per_layer = 8 * h * h + 4 * seq_len * h / (1 + int(causal)) + 4 * r * h * h
    return (3 + int(recompute)) * L * per_layer + 6 * h * V


def model_flops_per_token(
    arch: ModelArch, seq_len: int, recompute: bool, mean_attended: float | None = None
) -> float:
    """Exact matmul FLOPs per trained token: forward x3 (forward + backward), layers x4 with
    recomputation. `mean_attended` is the mean number of keys a query sees: (seq_len + 1) / 2
    for causal attention over a packed row (the default); smaller for varlen attention."""
    h, L, V = arch.hidden_size, arch.num_hidden_layers, arch.vocab_size
    kv = arch.num_key_value_heads * arch.head_dim
    attended = (seq_len + 1) / 2 if mean_attended is None else mean_attended
    projections = 2 * h * h + 2 * 2 * h * kv + 2 * h * h  # q, k, v, o
    mlp = 3 * 2 * h * arch.intermediate_size  # gate, up, down
    attention = 2 * 2 * attended * h  # scores and weighted sum
    layer_fwd = projections + mlp + attention
    return (3 + int(recompute)) * L * layer_fwd + 3 * 2 * h * V


def tflops(tgs: float, flops_per_token: float) -> float:
    """TFLOP/s per GPU from tokens per second per GPU."""
    return tgs * flops_per_token / 1e12


def gpu_peak_tflops(device_name: str | None) -> float | None:
    gpu = gpus.lookup(device_name)
    return gpu.peak_tflops if gpu else None


def mfu(model_tflops: float, peak_tflops: float | None) -> float | None:
    """Model FLOPs utilisation (0..1) against a device peak; None without a known peak."""
    return model_tflops / peak_tflops if peak_tflops else None
