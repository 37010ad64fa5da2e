"""The model families fbench builds, as data: each one's HF class, the first transformers release
that has it, what its decoder layer holds beyond Llama's, and the fields of its `config.json`.

`ModelArch` (`scenario/models.py`) validates a family's fields against `FAMILIES`; `read_config_json`
reads a real model's `config.json` into those fields (no weights: fbench builds random ones), and
`transformers_refusal` says why an env's transformers cannot build a family. No family falls back
to another: an unknown one is an error naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

MOE_FIELDS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
              "router_aux_loss_coef", "output_router_logits", "decoder_sparse_step", "mlp_only_layers")


@dataclass(frozen=True)
class Family:
    hf_class: str  # `architectures[0]` of its config.json
    since: str  # the first transformers release with the family (its release notes)
    qkv_bias: bool = False  # q, k and v always carry biases (Qwen2's attention, no config field)
    attention_bias_field: bool = False  # `attention_bias` (q, k, v and o biases) is a field of its config
    qk_norm: bool = False  # an RMSNorm over each head of q and k (Qwen3)
    head_dim_required: bool = False  # its config class defaults head_dim to 128, not hidden / heads
    moe_fields: tuple[str, ...] = ()
    shared_expert: bool = False  # a gated shared expert beside the routed ones (Qwen2-MoE)
    rms_norm_eps: float = 1e-6  # the config class's default

    @property
    def moe(self) -> bool:
        return bool(self.moe_fields)


FAMILIES: dict[str, Family] = {
    # fbench's Llama presets were always built with 1e-5 (Llama 2 and 3 publish it)
    "llama": Family("LlamaForCausalLM", "4.28.0", attention_bias_field=True, rms_norm_eps=1e-5),
    "mistral": Family("MistralForCausalLM", "4.34.0"),
    "qwen2": Family("Qwen2ForCausalLM", "4.37.0", qkv_bias=True),
    "qwen2_moe": Family("Qwen2MoeForCausalLM", "4.40.0", qkv_bias=True, moe_fields=MOE_FIELDS, shared_expert=True),
    "qwen3": Family("Qwen3ForCausalLM", "4.51.0", attention_bias_field=True, qk_norm=True, head_dim_required=True),
    "qwen3_moe": Family("Qwen3MoeForCausalLM", "4.51.0", attention_bias_field=True, qk_norm=True,
                        head_dim_required=True, moe_fields=MOE_FIELDS),
}


def known() -> str:
    return ", ".join(FAMILIES)


def _release(version: str) -> tuple[int, ...]:
    """'4.48.0' -> (4, 48, 0); a pre-release ('4.51.0.dev0', '5.0.0rc1') counts as its release."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+")[0])[:3])


# transformers 5.0 holds a MoE layer's experts as fused 3D tensors (experts.gate_up_proj, experts.down_proj),
# 4.x as one module per expert: the shared initial weights and the update projection, drawn per tensor
# name, would start and judge 4.x's experts otherwise than the 5.x reference's.
FUSED_EXPERTS = "5.0.0"


def transformers_refusal(family: str, version: str | None) -> str | None:
    """Why an env whose transformers is `version` cannot build `family` as fbench judges it (None: it
    can, or the env builds without transformers, which is its plugin's business)."""
    since = FAMILIES[family].since
    if version is None:
        return None
    if _release(version) < _release(since):
        return (f"{family} models ({FAMILIES[family].hf_class}) need transformers >= {since}; this env has "
                f"transformers {version}, which has no {family}")
    if FAMILIES[family].moe and _release(version) < _release(FUSED_EXPERTS):
        return (f"{family} on transformers {version}: each expert is a module of its own, where transformers >= "
                f"{FUSED_EXPERTS} (fbench's layout) fuses them into 3D tensors; the shared initial weights are drawn "
                "per tensor, so this model's experts would start from other weights than the reference's")
    return None


# config.json fields that decide nothing fbench measures or builds differently: bookkeeping, the
# tokenizer's ids (fbench's own tokenizer decides those), inference-only switches, the dtype (the
# scenario's precision decides it), the init std (fbench's initial weights use 0.02 for every
# backend), and RoPE scaling (no shape or FLOP changes; every backend gets the same plain RoPE).
IGNORED = frozenset({
    "_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "bos_token_id", "eos_token_id",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "initializer_range", "rope_scaling", "pretraining_tp",
    "max_window_layers", "auto_map",
})
# PretrainedConfig's own attributes, the same for every model (a config saved whole lists them):
# heads for other tasks, generation defaults, output switches.
GENERIC = frozenset({
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16", "tf_legacy_loss",
    "pruned_heads", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder", "cross_attention_hidden_size",
    "add_cross_attention", "tie_encoder_decoder", "finetuning_task", "id2label", "label2id", "num_labels",
    "tokenizer_class", "prefix", "task_specific_params", "problem_type", "max_length", "min_length", "do_sample",
    "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
    "bad_words_ids", "num_return_sequences", "output_scores", "return_dict_in_generate", "forced_bos_token_id",
    "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens",
})
# Taken as they are: the fields `ModelArch` has.
TAKEN = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "vocab_size", "rope_theta", "max_position_embeddings", "head_dim", "attention_bias", "tie_word_embeddings",
    "rms_norm_eps", "shared_expert_intermediate_size", *MOE_FIELDS,
})


_UNMODELLED = "fbench's FLOPs and memory assume full causal attention"
# Fields whose value fbench takes only as it builds them (`_not_modelled` says why another is refused).
CHECKED = frozenset({"hidden_act", "attention_dropout", "hidden_dropout", "mlp_bias", "use_sliding_window",
                     "sliding_window", "layer_types", "qkv_bias", "quantization_config", "rope_parameters"})


MAX_BYTES = 1 << 20  # a config.json is a few kB: a larger file is not one


class ConfigFileError(ValueError):
    """A config.json fbench cannot take: the message names the file and the field."""


def read_config_json(path: Path) -> dict:
    """The `ModelArch` fields of the model whose HF `config.json` is `path` (or a folder holding
    one). A field that would change what is built but that fbench does not model (sliding-window
    attention, another activation, dropout, a quantized checkpoint) or does not know is refused,
    named; the ones in `IGNORED` and `GENERIC` are left out."""
    path = path / "config.json" if path.is_dir() else path
    try:
        if not path.is_file():
            raise ConfigFileError(f"{path}: cannot read: " + ("not a regular file" if path.exists() else "no such file"))
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ConfigFileError(f"{path}: cannot read: larger than {MAX_BYTES >> 20} MiB, not a config.json")
        raw = json.loads(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    if not isinstance(raw, dict):
        raise ConfigFileError(f"{path}: a config.json holds a mapping")
    family = raw.get("model_type")
    if not isinstance(family, str) or family not in FAMILIES:
        raise ConfigFileError(f"{path}: model_type {family!r} is not a family fbench builds; known: {known()}")
    if (classes := raw.get("architectures")) not in (None, [FAMILIES[family].hf_class]):
        raise ConfigFileError(f"{path}: architectures {classes} is not {family}'s causal LM "
                              f"[{FAMILIES[family].hf_class!r}]")
    fields: dict = {"architecture": family}
    for key, value in raw.items():
        if key in ("model_type", "architectures") or key in IGNORED or key in GENERIC:
            continue
        if key in CHECKED:
            if why := _not_modelled(key, value, raw):
                raise ConfigFileError(f"{path}: {key} = {value!r}: {why}")
            if key == "rope_parameters":  # transformers >= 5 writes rope_theta here
                fields["rope_theta"] = value.get("rope_theta")
        elif key in TAKEN:
            fields[key] = value
        else:
            raise ConfigFileError(f"{path}: field {key!r} is not one fbench knows (neither a shape it builds nor "
                                  "one that changes nothing it measures: scenario/families.py lists both)")
    return fields


def _not_modelled(key: str, value, raw: dict) -> str | None:
    """Why a config.json value asks for something fbench does not build as it counts, or None."""
    if key == "hidden_act" and value != "silu":
        return "fbench counts a SwiGLU MLP (silu)"
    if key in ("attention_dropout", "hidden_dropout") and value not in (0, 0.0, None):
        return "dropout would make the backends' losses differ step by step; fbench trains without"
    if key == "mlp_bias" and value:
        return "fbench counts bias-free MLPs"
    if key == "use_sliding_window" and value:
        return f"sliding-window attention: {_UNMODELLED}"
    # Qwen configs carry a window that use_sliding_window false switches off; Mistral's has no switch
    if key == "sliding_window" and value is not None and raw.get("use_sliding_window", True):
        return f"sliding-window attention: {_UNMODELLED}; a Qwen config sets use_sliding_window false, a Mistral " \
               "one sliding_window null"
    if key == "layer_types" and any(t != "full_attention" for t in value or []):
        return f"{_UNMODELLED} in every layer"
    if key == "qkv_bias" and value is not True:
        return "Qwen2-MoE's q, k and v carry biases"
    if key == "quantization_config":
        return "a quantized checkpoint; fbench builds random weights (finetune.method qlora quantizes them)"
    if key == "rope_parameters" and (not isinstance(value, dict) or value.get("rope_type", "default") != "default"):
        return "fbench builds plain RoPE (rope_type default) with its rope_theta"
    return None
