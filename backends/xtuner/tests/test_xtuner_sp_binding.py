"""XTuner's sequence parallel cannot lie: the worker fails a run whose built model does not
run XTuner's SP attention (flash-attn 2, dispatched forward, SP group of the asked size)."""

from __future__ import annotations

import json
import subprocess

import pytest

from fbench_fixtures import backend_env_or_skip

from fbench_xtuner.sp_binding import sequence_parallel_problems

XT = "xtuner.model.modules.dispatch.llama.llama_attn_forward"
STOCK = "transformers.models.llama.modeling_llama.LlamaAttention.forward"


def _problems(**facts):
    base = dict(flash_attn_available=True, attn_implementation="flash_attention_2",
                attention_forwards=[XT] * 4, sp_group_size=8)
    return sequence_parallel_problems(8, **{**base, **facts})


def test_bound_sequence_parallel_passes():
    assert _problems() == []
    # SP 1 has nothing to verify, whatever the model runs
    assert sequence_parallel_problems(1, flash_attn_available=False, attn_implementation="sdpa",
                                      attention_forwards=[STOCK], sp_group_size=1) == []


def test_each_way_it_could_lie_is_named():
    assert "flash-attn 2 is not importable" in _problems(flash_attn_available=False)[0]
    assert "'sdpa', not 'flash_attention_2'" in _problems(attn_implementation="sdpa")[0]
    [stock] = _problems(attention_forwards=[XT, XT, STOCK, STOCK])
    assert "2 of 4 attention modules run " + STOCK in stock
    assert "no attention module" in _problems(attention_forwards=[])[0]
    assert "group has 4 ranks, the scenario asks for 8" in _problems(sp_group_size=4)[0]
    # what a CPU/no-flash-attn build looks like: every problem at once
    assert len(_problems(flash_attn_available=False, attn_implementation="sdpa", attention_forwards=[STOCK],
                         sp_group_size=1)) == 4


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_worker_refuses_a_model_without_xtuners_dispatch():
    """In the xtuner env: a tiny Llama through XTuner's own dispatch (no flash-attn here, so
    nothing is dispatched) fails the worker's check for SP 2, and passes for SP 1."""
    env = backend_env_or_skip("xtuner")
    probe = """
import json, torch
from transformers import LlamaConfig, LlamaForCausalLM
from xtuner.model.modules import dispatch_modules
from fbench_xtuner.sp_binding import verify_sequence_parallel
llm = LlamaForCausalLM(LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                   attn_implementation="sdpa"))
dispatch_modules(llm)
verify_sequence_parallel(llm, 1)
try:
    verify_sequence_parallel(llm, 2)
    print(json.dumps(None))
except RuntimeError as e:
    print(json.dumps(str(e)))
"""
    out = subprocess.run([str(env.python), "-c", probe], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    message = json.loads(out.stdout.strip().splitlines()[-1])
    assert message and message.startswith("XTuner's sequence parallel 2 is not what would train")
    assert "flash-attn 2 is not importable" in message and "'sdpa'" in message
    assert "2 of 2 attention modules run transformers.models.llama.modeling_llama.LlamaAttention.forward" in message
    assert "group has 1 ranks" in message
