"""Settings read live: whether the optimizer steps a copy of the weights
(`master_weights`) is read from what it steps; how grouped K/V heads reach the attention kernel is
read from the first attention call (`settings.KvRepeatProbe`), not assumed from a rule that
takes no mask; run in the torch env (transformers 5.6, which passes `enable_gqa` only
without a mask) on a real HF Llama of the tiny preset (GQA 4/2)."""

from __future__ import annotations

import json
import subprocess

import pytest

from fbench_fixtures import backend_env_or_skip

from framework_bench.scenario import scenario

PROBE = """
import json, sys, torch, transformers
import torch.nn.functional as F
from framework_bench.worker import settings
cfg = json.loads(sys.argv[1])
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
ids = torch.arange(1, 33).unsqueeze(0)
out = {"rule": settings.model_settings(model)["attention_kv_repeat"]}
original = F.scaled_dot_product_attention
for case, mask in (("no mask", None), ("padding mask", torch.cat([torch.zeros(1, 4), torch.ones(1, 28)], 1).long())):
    probe = settings.KvRepeatProbe().install()
    model(input_ids=ids, attention_mask=mask)
    out[case] = probe.settle(settings.model_settings(model))["attention_kv_repeat"]
    out[case + ": unwrapped after one call"] = F.scaled_dot_product_attention is original
print(json.dumps(out))
"""


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_kv_repeat_probe_reads_the_first_attention_call_where_the_rule_assumed_no_mask():
    env = backend_env_or_skip("torch")
    cfg = scenario.load("tiny_cpu").model_config_for_run
    out = subprocess.run([str(env.python), "-c", PROBE, json.dumps(cfg)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout)
    assert seen["rule"] == "native (sdpa enable_gqa)"
    assert seen["no mask"] == "native (sdpa enable_gqa)"
    assert seen["padding mask"] == "repeated (repeat_kv)"  # a mask: transformers repeats K/V, the rule said native
    assert seen["no mask: unwrapped after one call"] and seen["padding mask: unwrapped after one call"]


MASTER = """
import json, torch
from framework_bench.worker import settings
model = torch.nn.Linear(4, 4)
own = torch.optim.AdamW(model.parameters())
copy = torch.optim.AdamW([p.detach().clone().double() for p in model.parameters()])

class Stage3Like:  # DeepSpeed ZeRO-3: its flat fp32 partitions, the torch optimizer's groups empty between steps
    def __init__(self):
        self.optimizer = torch.optim.AdamW([torch.zeros(1)])
        self.optimizer.param_groups[0]["params"] = []
        self.fp32_partitioned_groups_flat = [torch.zeros(8)]
    param_groups = property(lambda self: self.optimizer.param_groups)

class Wrapper:  # accelerate / mmengine keep the optimizer as `.optimizer`
    def __init__(self, inner):
        self.optimizer = inner
    param_groups = property(lambda self: self.optimizer.param_groups)

print(json.dumps([settings.master_weights(model, o) for o in (own, Wrapper(own), copy, Wrapper(Stage3Like()))]))
"""


@pytest.mark.slow  # starts a framework's or the host's own process
def test_master_weights_are_read_from_what_the_optimizer_steps():
    env = backend_env_or_skip("torch")
    out = subprocess.run([str(env.python), "-c", MASTER], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == ["none", "none", "float64 (the optimizer's copy)", "float32 (the optimizer's copy)"]
