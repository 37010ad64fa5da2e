"""Model architectures: the HF-style fields that decide speed, and the named presets."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

Int = Annotated[int, Strict()]  # no booleans or floats where a count belongs


class ModelArch(BaseModel):
    """A decoder-only transformer, described by the fields of its HF `config.json`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    architecture: Literal["llama"] = "llama"
    hidden_size: Int = Field(gt=0)
    num_hidden_layers: Int = Field(gt=0)
    num_attention_heads: Int = Field(gt=0)
    num_key_value_heads: Int = Field(gt=0)
    intermediate_size: Int = Field(gt=0)
    vocab_size: Int = Field(gt=0)
    rope_theta: Annotated[float, Strict()] = Field(gt=0)
    max_position_embeddings: Int = Field(gt=0)

    @model_validator(mode="after")
    def _heads_fit(self) -> "ModelArch":
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not divisible by num_attention_heads {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} is not divisible by "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        """The width of K and V: their heads (fewer under GQA) x head_dim."""
        return self.num_key_value_heads * self.head_dim

    @property
    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """Each decoder layer's linear modules by the name peft targets them by, as
        (in_features, out_features); the LM head is not among them (LoRA never targets it here)."""
        h, i, kv = self.hidden_size, self.intermediate_size, self.kv_dim
        return {"q_proj": (h, h), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (h, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def hf_config(self) -> dict:
        """The `config.json` a worker hands to `AutoConfig`/`from_config` (random weights)."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-5,
            "initializer_range": 0.02,
            "tie_word_embeddings": False,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
        }


def parameter_counts(arch: ModelArch) -> dict[str, int]:
    """The model's parameters by kind of layer, the one count every memory and FLOPs figure
    uses: per decoder layer its linear weights (`linear_shapes`) and two RMSNorms, with `layer`
    their sum; the embeddings and the untied LM head (V x h each) and the final norm once;
    `model` the whole, num_hidden_layers layers."""
    h, v = arch.hidden_size, arch.vocab_size
    linear = sum(i * o for i, o in arch.linear_shapes.values())
    counts = {"layer_linear": linear, "layer_norms": 2 * h, "layer": linear + 2 * h,
              "embedding": v * h, "lm_head": v * h, "final_norm": h}
    return counts | {"model": counts["embedding"] + counts["lm_head"] + arch.num_hidden_layers * counts["layer"]
                     + counts["final_norm"]}


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
    # Small enough to train a few steps on 2 CPU cores; vocab covers the built-in byte tokenizer.
    "tiny-llama": ModelArch(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=688, vocab_size=512, rope_theta=10000.0, max_position_embeddings=8192,
    ),
}
