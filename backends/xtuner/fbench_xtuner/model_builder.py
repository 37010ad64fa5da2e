"""The `llm` builder the generated config names (runs in the XTuner env).

SupervisedFinetune reads `pretrained_model_name_or_path` from its `llm` dict and may add
`torch_dtype`/`attn_implementation` (flash-attn present) before building it, so the
builder takes those keyword arguments, but builds random weights from the config alone:
the benchmark needs the architecture, not a checkpoint (and no hub is reachable).

Where the weights are made: on a GPU run they are initialised directly on this rank's GPU
(the process group, hence the current device, is set up before the model is built), not in
fp32 on the CPU and copied over: for a 7B model that is seconds instead of minutes. Under
ZeRO-3 transformers builds them inside DeepSpeed's `zero.Init` (XTuner's strategy registers
the DeepSpeed config first), already partitioned, so that path is left to it.

Then every parameter is overwritten with the compare's initial weights (`init_seed`: the
SDK's `initial_weights_worker.fill`), before XTuner's model, mmengine's wrapper or DeepSpeed see it.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

from framework_bench.worker import initial_weights_worker


def build_random_llm(pretrained_model_name_or_path: str, init_seed: int, trust_remote_code: bool = False,
                     keep_fp32_weights: bool = False, **kwargs):
    model = _from_config(pretrained_model_name_or_path, trust_remote_code, keep_fp32_weights, **kwargs)
    initial_weights_worker.fill(model, init_seed, model.config.to_dict())
    return model


def _from_config(pretrained_model_name_or_path: str, trust_remote_code: bool, keep_fp32_weights: bool, **kwargs):
    """`keep_fp32_weights` (matched settings): ignore the bf16 `torch_dtype` XTuner adds when it
    picks flash-attn, so the weights stay fp32 under bf16 autocast as on the other backend."""
    if keep_fp32_weights:
        kwargs.pop("torch_dtype", None)
    config = AutoConfig.from_pretrained(pretrained_model_name_or_path, trust_remote_code=trust_remote_code)
    if torch.cuda.is_available() and not is_deepspeed_zero3_enabled():
        with torch.device("cuda", torch.cuda.current_device()):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
    return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, **kwargs)
