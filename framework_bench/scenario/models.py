"""Model architectures: the HF `config.json` fields that decide speed, by family
(`scenario/families.py`), their parameters by part, and the named presets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, Strict,
                      StrictBool, model_serializer, model_validator)

from framework_bench.scenario.families import FAMILIES, Family, known

Int = Annotated[int, Strict()]  # no booleans or floats where a count belongs
Float = Annotated[float, Strict()]
MOE_DEFAULTS = {"norm_topk_prob": False, "router_aux_loss_coef": 0.001, "output_router_logits": False,
                "decoder_sparse_step": 1, "mlp_only_layers": ()}  # the HF config classes' defaults


class ModelArch(BaseModel):
    """A decoder-only transformer, described by the fields of its HF `config.json`. `architecture`
    is the family (its `model_type`); a field the family's config class does not have is refused,
    and one it defaults is filled in with that default (MoE settings, `rms_norm_eps`,
    `attention_bias`). `head_dim` stays unset where the family derives it (hidden / heads)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    architecture: Literal[tuple(FAMILIES)] = "llama"
    hidden_size: Int = Field(gt=0)
    num_hidden_layers: Int = Field(gt=0)
    num_attention_heads: Int = Field(gt=0)
    num_key_value_heads: Int = Field(gt=0)
    intermediate_size: Int = Field(gt=0, description="the dense MLP's width (a MoE family's layers in mlp_only_layers)")
    vocab_size: Int = Field(gt=0)
    rope_theta: Float = Field(gt=0)
    max_position_embeddings: Int = Field(gt=0)
    head_dim: Int | None = Field(None, gt=0, description="one attention head's width; unset: hidden / heads")
    attention_bias: StrictBool | None = Field(None, description="q, k, v and o carry biases (llama, qwen3 families)")
    tie_word_embeddings: StrictBool = False
    rms_norm_eps: Float | None = Field(None, gt=0)
    # MoE families
    num_experts: Int | None = Field(None, gt=0)
    num_experts_per_tok: Int | None = Field(None, gt=0, description="experts each token is routed to (top-k)")
    moe_intermediate_size: Int | None = Field(None, gt=0, description="one expert's MLP width")
    shared_expert_intermediate_size: Int | None = Field(None, gt=0, description="qwen2_moe's shared expert's width")
    norm_topk_prob: StrictBool | None = None
    router_aux_loss_coef: Float | None = Field(None, ge=0)
    output_router_logits: StrictBool | None = Field(None, description="the router's aux loss joins the training loss")
    decoder_sparse_step: Int | None = Field(None, gt=0, description="every n-th layer is MoE")
    mlp_only_layers: tuple[Int, ...] | None = Field(None, description="layers (from 0) with a dense MLP instead")

    @model_validator(mode="before")
    @classmethod
    def _family_defaults(cls, data: object) -> object:
        name = data.get("architecture", "llama") if isinstance(data, dict) else None
        if not isinstance(name, str):
            return data  # not a mapping, or a family that is no name: the field's own error says so
        if name not in FAMILIES:  # one error, not one per field the family would have
            raise ValueError(f"unknown model family {name!r}; fbench builds {known()}")
        family = FAMILIES[name]
        defaults = {"rms_norm_eps": family.rms_norm_eps} | (MOE_DEFAULTS if family.moe else {})
        if family.attention_bias_field:
            defaults["attention_bias"] = False
        return {**defaults, **{k: v for k, v in data.items() if v is not None}}

    @model_validator(mode="after")
    def _fits_the_family(self) -> "ModelArch":
        family, name = self.family, self.architecture
        given = lambda fields: [f for f in fields if getattr(self, f) is not None]  # noqa: E731
        if not family.moe and (extra := given(("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                                 *MOE_DEFAULTS))):
            raise ValueError(f"{', '.join(extra)}: MoE settings, and {name} is a dense family "
                             f"(MoE: {', '.join(n for n, f in FAMILIES.items() if f.moe)})")
        if family.moe and (missing := [f for f in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")
                                       if getattr(self, f) is None]):
            raise ValueError(f"{name} needs {', '.join(missing)}")
        if family.shared_expert != (self.shared_expert_intermediate_size is not None):
            raise ValueError(f"shared_expert_intermediate_size: {name} " + (
                "has a shared expert: give its width" if family.shared_expert else "has no shared expert"))
        if self.attention_bias is not None and not family.attention_bias_field:
            raise ValueError(f"attention_bias: not a field of {name} ("
                             + ("its q, k and v always carry biases, o none)" if family.qkv_bias else "no biases)"))
        if family.moe:
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(f"num_experts_per_tok {self.num_experts_per_tok} exceeds num_experts {self.num_experts}")
            if bad := [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]:
                raise ValueError(f"mlp_only_layers {bad}: layers are numbered 0 to {self.num_hidden_layers - 1}")
        if self.head_dim is None:
            if family.head_dim_required:
                raise ValueError(f"{name} needs head_dim (its config class defaults it to 128, not hidden / heads)")
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                                 f"{self.num_attention_heads} (give head_dim)")
        elif family.qkv_bias and self.head_dim * self.num_attention_heads != self.hidden_size:
            raise ValueError(f"head_dim: {name} derives it as hidden_size / num_attention_heads "
                             f"({self.hidden_size / self.num_attention_heads:g})")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads {self.num_attention_heads} is not divisible by "
                             f"num_key_value_heads {self.num_key_value_heads}")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict:
        """Only the fields the family has (a dense model's dump names no MoE setting)."""
        return {k: v for k, v in handler(self).items() if v is not None}

    @property
    def family(self) -> Family:
        return FAMILIES[self.architecture]

    @property
    def head_size(self) -> int:
        """One attention head's width: `head_dim`, or hidden / heads where the family derives it."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def q_dim(self) -> int:
        """The width of Q and of the attention output: heads x head width."""
        return self.num_attention_heads * self.head_size

    @property
    def kv_dim(self) -> int:
        """The width of K and V: their heads (fewer under GQA) x head width."""
        return self.num_key_value_heads * self.head_size

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """The layers (from 0) whose MLP is routed experts, as HF's decoder layer decides."""
        if not self.family.moe:
            return ()
        return tuple(i for i in range(self.num_hidden_layers)
                     if i not in self.mlp_only_layers and (i + 1) % self.decoder_sparse_step == 0)

    @property
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linear modules by the name peft targets them by, as
        (in_features, out_features): attention's, and a dense family's MLP. A MoE family's are
        attention's only: transformers >= 5 holds its experts as 3D tensors, not linear modules
        peft finds by name (and 4.x as one module per expert), and its dense layers' MLP shares
        the experts' names. The LM head is not among them (LoRA never targets it here)."""
        h, i, q, kv = self.hidden_size, self.intermediate_size, self.q_dim, self.kv_dim
        attention = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
        return attention if self.family.moe else attention | {"gate_proj": (h, i), "up_proj": (h, i),
                                                               "down_proj": (i, h)}

    def hf_config(self) -> dict:
        """The `config.json` a worker hands to `AutoConfig`/`from_config` (random weights): the
        family's own class, and every field its config class would otherwise default differently."""
        family = self.family
        cfg = {
            "architectures": [family.hf_class],
            "model_type": self.architecture,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "initializer_range": 0.02,
            "tie_word_embeddings": self.tie_word_embeddings,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        }
        if self.head_dim is not None:
            cfg["head_dim"] = self.head_dim
        if self.attention_bias:
            cfg["attention_bias"] = True
        if self.architecture == "mistral":
            cfg["sliding_window"] = None  # MistralConfig defaults to a 4096 window, which fbench does not model
        if family.moe:
            cfg |= {k: getattr(self, k) for k in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                                  *MOE_DEFAULTS)}
            cfg["mlp_only_layers"] = list(self.mlp_only_layers)
        if family.shared_expert:
            cfg["shared_expert_intermediate_size"] = self.shared_expert_intermediate_size
        return cfg


def parameter_counts(arch: ModelArch) -> dict[str, int]:
    """The model's parameters by part, the one count every memory and FLOPs figure uses, as HF
    builds the family. Per layer: `attention` (q, k, v, o weights, their biases, the per-head q/k
    norms), `layer_norms` (two RMSNorms), `dense_mlp` (gate, up, down), `moe_mlp` (the router,
    every expert and the shared expert with its gate) and `moe_mlp_active` (the router, the top-k
    experts, the shared expert). Over the model: `embedding`, `lm_head` (0 when tied to the
    embedding), `head_matmul` (the LM head's weights as a matmul, tied or not), `final_norm`;
    `layers` every decoder layer, `layer` the largest one (what ZeRO-3 or FSDP gathers at once),
    `linear` the weights of linear modules (what bitsandbytes quantizes: attention's, dense MLPs',
    shared experts'; transformers >= 5 holds routed experts and routers as plain tensors),
    `active_linear` the matmul weights one token passes through, `largest_tensor`; `model` the
    whole and `active` what one token uses (every expert but its top-k left out)."""
    h, v, L = arch.hidden_size, arch.vocab_size, arch.num_hidden_layers
    family, q, kv = arch.family, arch.q_dim, arch.kv_dim
    attention_weights = h * q + 2 * h * kv + q * h
    bias = (q + 2 * kv if family.qkv_bias else 0) + (q + 2 * kv + h if arch.attention_bias else 0)
    attention = attention_weights + bias + (2 * arch.head_size if family.qk_norm else 0)
    dense_mlp = 3 * h * arch.intermediate_size
    n_moe = len(arch.moe_layers)
    expert = 3 * h * (arch.moe_intermediate_size or 0)
    router = h * (arch.num_experts or 0)
    shared = 3 * h * arch.shared_expert_intermediate_size + h if family.shared_expert else 0
    moe_mlp = router + (arch.num_experts or 0) * expert + shared
    moe_active = router + (arch.num_experts_per_tok or 0) * expert + shared
    layer_norms = 2 * h
    dense_layer, moe_layer = attention + layer_norms + dense_mlp, attention + layer_norms + moe_mlp
    counts = {
        "attention": attention, "layer_norms": layer_norms, "dense_mlp": dense_mlp, "moe_mlp": moe_mlp,
        "moe_mlp_active": moe_active, "embedding": v * h, "lm_head": 0 if arch.tie_word_embeddings else v * h,
        "head_matmul": v * h, "final_norm": h,
        "layers": (L - n_moe) * dense_layer + n_moe * moe_layer,
        "layer": max(dense_layer if n_moe < L else 0, moe_layer if n_moe else 0),
        "linear": L * attention_weights + (L - n_moe) * dense_mlp + n_moe * shared,
        "active_linear": L * attention_weights + (L - n_moe) * dense_mlp + n_moe * moe_active,
        # the embedding, or transformers 5's fused gate and up projections of every expert
        "largest_tensor": max(v * h, 2 * expert // 3 * (arch.num_experts or 0)),
    }
    outside = counts["embedding"] + counts["lm_head"] + counts["final_norm"]
    return counts | {"model": outside + counts["layers"],
                     "active": outside + counts["layers"] - n_moe * (moe_mlp - moe_active)}


def parameter_count(arch: ModelArch) -> int:
    """All the model's parameters (`parameter_counts`)."""
    return parameter_counts(arch)["model"]


PRESETS: dict[str, ModelArch] = {
    # meta-llama/Llama-2-7b-hf
    "llama2-7b": ModelArch(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
        intermediate_size=11008, vocab_size=32000, rope_theta=10000.0, max_position_embeddings=4096,
    ),
    # 01-ai/Yi-34B-200K: GQA with 8 KV heads
    "yi-34b-200k": ModelArch(
        hidden_size=7168, num_hidden_layers=60, num_attention_heads=56, num_key_value_heads=8,
        intermediate_size=20480, vocab_size=64000, rope_theta=5000000.0, max_position_embeddings=200000,
    ),
    # meta-llama/Llama-2-70b-hf: GQA with 8 KV heads
    "llama2-70b": ModelArch(
        hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
        intermediate_size=28672, vocab_size=32000, rope_theta=10000.0, max_position_embeddings=4096,
    ),
    # meta-llama/Llama-3.1-8B: GQA with 8 KV heads (rope scaling left out: it changes no shape or FLOP)
    "llama3-8b": ModelArch(
        hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
    ),
    # mistralai/Mistral-7B-v0.3 config.json: 7.25 B. v0.3, not v0.1: v0.1's 4096-token sliding window is
    # attention fbench does not model (its config.json is refused, saying so)
    "mistral-7b": ModelArch(
        architecture="mistral", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=14336, vocab_size=32768, rope_theta=1000000.0,
        max_position_embeddings=32768, rms_norm_eps=1e-5,
    ),
    # Qwen/Qwen2.5-7B config.json (use_sliding_window false): 7.62 B, biases on q, k, v
    "qwen2.5-7b": ModelArch(
        architecture="qwen2", hidden_size=3584, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, intermediate_size=18944, vocab_size=152064, rope_theta=1000000.0,
        max_position_embeddings=131072,
    ),
    # Qwen/Qwen3-8B config.json: 8.19 B (published 8.2 B), q/k norms, head_dim 128
    "qwen3-8b": ModelArch(
        architecture="qwen3", hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936,
        rope_theta=1000000.0, max_position_embeddings=40960,
    ),
    # Qwen/Qwen3-30B-A3B config.json: 30.5 B total, 3.35 B active (published 3.3 B); 128 experts, top-8,
    # no shared expert; q (32 x 128) wider than hidden 2048
    "qwen3-30b-a3b": ModelArch(
        architecture="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, intermediate_size=6144, vocab_size=151936,
        rope_theta=1000000.0, max_position_embeddings=40960, num_experts=128, num_experts_per_tok=8,
        moe_intermediate_size=768, norm_topk_prob=True, router_aux_loss_coef=0.001,
    ),
    # Small enough to train a few steps on 2 CPU cores; vocab covers the built-in byte tokenizer.
    "tiny-llama": ModelArch(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=688, vocab_size=512, rope_theta=10000.0, max_position_embeddings=8192,
    ),
    # tiny-llama's shapes as Qwen3 (q/k norms, explicit head_dim)
    "tiny-qwen3": ModelArch(
        architecture="qwen3", hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, intermediate_size=688, vocab_size=512, rope_theta=1000000.0, max_position_embeddings=8192,
    ),
    # Qwen3-MoE in small: 8 experts of width 128, top-2, as Qwen3-30B-A3B normalises the top-k weights;
    # intermediate_size is the (unused: every layer is MoE) dense width HF requires
    "tiny-qwen3-moe": ModelArch(
        architecture="qwen3_moe", hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, intermediate_size=688, vocab_size=512, rope_theta=1000000.0,
        max_position_embeddings=8192, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=128,
        norm_topk_prob=True,
    ),
}
