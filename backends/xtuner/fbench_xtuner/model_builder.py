"""The `llm` builder the generated config names (runs in the XTuner env).

SupervisedFinetune reads `pretrained_model_name_or_path` from its `llm` dict and may add
`torch_dtype`/`attn_implementation` (flash-attn present) before building it, so the
builder takes those keyword arguments, but builds random weights from the config alone:
the benchmark needs the architecture, not a checkpoint (and no hub is reachable).
"""

from __future__ import annotations

from transformers import AutoConfig, AutoModelForCausalLM


def build_random_llm(pretrained_model_name_or_path: str, trust_remote_code: bool = False,
                     keep_fp32_weights: bool = False, **kwargs):
    """`keep_fp32_weights` (matched settings): ignore the bf16 `torch_dtype` XTuner adds when it
    picks flash-attn, so the weights stay fp32 under bf16 autocast as on the other backend."""
    if keep_fp32_weights:
        kwargs.pop("torch_dtype", None)
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=trust_remote_code)
    return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
