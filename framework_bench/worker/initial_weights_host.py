"""The initial weights every backend trains from (host side, numpy only): the generator's
definition and the host's check of them.

Every framework builds its model its own way (transformers 4.48 under XTuner, 5.6 under
LLaMA-Factory, mmengine consuming random numbers between seeding and building), so seeding
alone does not give them the same weights. Instead the worker SDK
(`framework_bench.worker.initial_weights_worker`, the torch twin of this module) overwrites
every parameter right after the framework built the model, from a counter-based generator:
the value of element `i` of the tensor named `name` depends only on (seed, name, i). That
makes it random-access, so the host recomputes a sample here and compares it with the values
the worker read from the live parameters, without a weight file anywhere. It sits in the
worker package, the bottom layer, because the torch twin takes its constants and names from
here: the generator is defined once.

The distribution is HF Llama's `_init_weights`: normal(0, initializer_range) for linear and
embedding weights (the padding row of the embedding zero), ones for norm weights (1-D
`weight`), zeros for biases. LoRA adapters (peft's names, whichever framework made them):
A normal(0, initializer_range) from the seed, B zero, so the adapted model starts as the
base does (peft draws A kaiming-uniform; B zero as peft).

The generator: a 32-bit integer hash ("lowbias32", C. Wellons) of the element index mixed
with a per-tensor key, twice, gives two uniforms for a Box-Muller normal in float64. All
integer arithmetic stays in int64 masked to 32 bits, so numpy and torch compute the same bits.
"""

from __future__ import annotations

import zlib

import numpy as np

SAMPLES_PER_TENSOR = 1024
REPORT_FILE = "initial_weights.json"  # RUN_DIR/..., written by rank 0 of the worker

MASK32 = 0xFFFFFFFF
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B
_STREAM_A, _STREAM_B, _STREAM_SAMPLE = 0x9E3779B9, 0x85EBCA6B, 0xC2B2AE35
# Wrapper prefixes frameworks put before HF's own names (XTuner's SupervisedFinetune, DDP,
# DeepSpeed, torch.compile): stripped so every backend fills a tensor from the same key.
WRAPPER_PREFIXES = ("module.", "llm.", "_orig_mod.", "base_model.model.")
# peft keeps an adapted linear's own weight under `base_layer` and each adapter under its
# name ("default"): dropped, so a base weight has its full-fine-tuning key (the same base
# weights) and an adapter one key across frameworks (`...q_proj.lora_A.weight`).
PEFT_SEGMENTS = {".base_layer.": ".", ".lora_A.default.": ".lora_A.", ".lora_B.default.": ".lora_B."}
# Tolerance of the sampled check, relative to initializer_range: the two twins round the same
# float64 figure; 16-bit parameters hold it to ~3 significant digits.
TOLERANCE = {"float32": 1e-6, "float64": 1e-6}
TOLERANCE_16BIT = 1e-2
# QLoRA's 4-bit base, dequantized: nf4/fp4 hold 16 levels of each 64-weight block's absmax
# (~2.5 std for normal weights), so a value may be off by half the widest gap (~0.3 absmax).
TOLERANCE_4BIT = {"nf4": 0.5, "fp4": 0.5}


def hash32(x):
    """lowbias32 on int64 arrays (numpy or torch) holding values in [0, 2**32)."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & MASK32
    return x ^ (x >> 16)


def canonical_name(name: str) -> str:
    """HF's parameter name, wrapper prefixes and peft's segments stripped
    (`llm.model.layers.0...` -> `model.layers.0...`, `base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight`
    -> `model.layers.0.self_attn.q_proj.lora_A.weight`)."""
    for segment, kept in PEFT_SEGMENTS.items():
        name = name.replace(segment, kept)
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPER_PREFIXES:
            if name.startswith(prefix):
                name, stripped = name[len(prefix):], True
    return name


def is_adapter(name: str) -> bool:
    """A LoRA adapter's parameter (peft's `lora_A`/`lora_B`), whatever wraps it."""
    return ".lora_A." in canonical_name(name) or ".lora_B." in canonical_name(name)


def starts_revealed(name: str, adapters: bool) -> bool:
    """Whether the tensor is one the run trains (every tensor; with adapters, the adapters only),
    whose initial values come from the seed the host reveals once the worker is ready for its
    first step (`initial_weights_worker.fill_revealed`); the rest from the job's seed, known from
    the start (a frozen base: QLoRA quantizes it as it is built)."""
    return not adapters or is_adapter(name)


def tensor_key(seed: int, name: str) -> int:
    """The per-tensor key: the seed and the canonical name, hashed (a Python int < 2**32)."""
    # Python ints for the scalar: exact, where a numpy int64 scalar's product warns on overflow
    mixed = np.array([(zlib.crc32(canonical_name(name).encode()) ^ hash32(seed & MASK32)) & MASK32],
                     dtype=np.int64)
    return int(hash32(mixed)[0])


def projection_key(projection_seed: int, name: str) -> int:
    """The key of the update projection's random vector over the tensor `name`: another
    stream than the initial weights' (a projection seed equal to the seed gives another vector)."""
    return tensor_key(projection_seed, "update-projection/" + canonical_name(name))


def kind(name: str, ndim: int) -> str:
    """How HF initialises the tensor: "normal", "ones" (norm weights) or "zeros" (biases,
    LoRA's B)."""
    if name.endswith(".bias") or ".lora_B." in name:
        return "zeros"
    return "ones" if ndim == 1 else "normal"


def standard_normal(indices: np.ndarray, key: int) -> np.ndarray:
    """float64 N(0, 1) at the given flat element indices of the tensor with this key."""
    base = hash32((indices.astype(np.int64) ^ key) & MASK32)
    u1 = (hash32(base ^ _STREAM_A).astype(np.float64) + 1.0) / 2.0**32  # (0, 1]: log is finite
    u2 = hash32(base ^ _STREAM_B).astype(np.float64) / 2.0**32
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def sample_indices(seed: int, name: str, numel: int) -> np.ndarray:
    """The flat indices the worker reports and the host recomputes: all of a small tensor,
    else SAMPLES_PER_TENSOR positions drawn from (seed, name)."""
    if numel <= SAMPLES_PER_TENSOR:
        return np.arange(numel, dtype=np.int64)
    draws = hash32((np.arange(SAMPLES_PER_TENSOR, dtype=np.int64) ^ tensor_key(seed, name) ^ _STREAM_SAMPLE) & MASK32)
    return draws % numel


def expected_values(seed: int, name: str, shape: list[int], indices: np.ndarray, std: float,
                    pad_token_id: int | None) -> np.ndarray:
    """The initial values at `indices` of the tensor `name` (float64)."""
    how = kind(canonical_name(name), len(shape))
    if how == "ones":
        return np.ones(len(indices))
    if how == "zeros":
        return np.zeros(len(indices))
    values = standard_normal(indices, tensor_key(seed, name)) * std
    if canonical_name(name).endswith("embed_tokens.weight") and pad_token_id is not None:
        values[indices // shape[1] == pad_token_id] = 0.0
    return values


def check(report: dict | None, seed: int, hf_config: dict, param_count: int, adapters: bool = False) -> tuple[str, str]:
    """("pass" | "fail" | "unverified", detail) for the worker's sampled initial weights:
    every sampled value within tolerance, the seed the host asked for, all parameters covered.
    The trained tensors (`starts_revealed`) from the report's `trained_seed` (whether the host
    revealed that one is the `initial_reveal` check's); a report without one (an older SDK's)
    filled them from `seed` too."""
    if not report:
        return "unverified", "unverified: the worker reported no initial-weight samples"
    if report.get("seed") != seed:
        return "fail", f"filled with seed {report.get('seed')}, the compare's seed is {seed}"
    trained = report.get("trained_seed", seed)
    std, pad = float(hf_config.get("initializer_range", 0.02)), hf_config.get("pad_token_id")
    covered, worst = 0, (0.0, "")
    for name, tensor in report.get("tensors", {}).items():
        shape, values = tensor["shape"], np.asarray(tensor["values"], dtype=np.float64)
        numel = int(np.prod(shape))
        covered += numel
        want = expected_values(trained if starts_revealed(name, adapters) else seed, name, shape,
                               sample_indices(seed, name, numel), std, pad)
        if values.shape != want.shape:
            return "fail", f"{name}: {values.size} samples reported, {want.size} expected"
        dtype = tensor.get("dtype", "")
        tol = TOLERANCE.get(dtype) or TOLERANCE_4BIT.get(dtype) or TOLERANCE_16BIT
        off = float(np.max(np.abs(values - want) / np.maximum(np.abs(want), std))) if numel else 0.0
        if not off <= tol:  # NaN fails too
            return "fail", f"{name}: sampled initial values off by {off:.2g} (relative), more than {tol:g}"
        worst = max(worst, (off, name))
    if covered != param_count:
        return "fail", f"the samples cover {covered:,} parameters, the model has {param_count:,}"
    revealed = f", the trained ones from the revealed seed {trained}" if trained != seed else ""
    return "pass", (f"seed {seed}{revealed}: {len(report['tensors'])} tensors sampled, largest relative difference "
                    f"{worst[0]:.1e}")
