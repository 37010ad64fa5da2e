"""The same initial weights everywhere: the host's numpy generator, its
torch twin in the worker SDK (run in the torch env on a real HF Llama built from the tiny
preset), and the host's sampled check of what a worker reports."""

from __future__ import annotations

import json
import subprocess
import zlib

import numpy as np
import pytest

from fbench_fixtures import backend_env_or_skip

from framework_bench.worker import initial_weights_host as iw
from framework_bench.scenario import scenario
from framework_bench.scenario.models import parameter_count as expected_param_count


def test_values_are_random_access_and_hf_distributed():
    idx = np.arange(200_000)
    whole = iw.expected_values(7, "model.layers.0.mlp.up_proj.weight", [400, 500], idx, 0.02, None)
    # any subset, in any order, is the same figures: the host can recompute a sample alone
    picked = np.array([199_999, 3, 123_456, 0])
    assert np.array_equal(iw.expected_values(7, "model.layers.0.mlp.up_proj.weight", [400, 500], picked, 0.02, None),
                          whole[picked])
    assert abs(whole.mean()) < 2e-4 and whole.std() == pytest.approx(0.02, rel=0.01)
    assert np.all(iw.expected_values(7, "model.norm.weight", [64], np.arange(64), 0.02, None) == 1.0)
    assert np.all(iw.expected_values(7, "lm_head.bias", [64], np.arange(64), 0.02, None) == 0.0)
    embed = iw.expected_values(7, "model.embed_tokens.weight", [10, 8], np.arange(80), 0.02, pad_token_id=2)
    assert np.all(embed[16:24] == 0.0) and np.all(embed[:16] != 0.0)


def test_every_32_bit_seed_keys_its_tensors_as_the_wrapped_int64_arithmetic_does(recwarn):
    """A compare draws any 32-bit seed: the scalar key is the low 32 bits of the same arithmetic
    the arrays do in int64 (wrapping), with no overflow warning."""
    name = "model.layers.0.mlp.up_proj.weight"
    for seed in (0, 2, 1024, 2**31 + 7, 3_000_000_000, 2**32 - 1):  # 2 overflowed a numpy int64 scalar
        x = np.array([seed], dtype=np.int64)
        mixed = np.array([(zlib.crc32(name.encode()) ^ int(iw.hash32(x)[0])) & iw.MASK32], dtype=np.int64)
        assert iw.tensor_key(seed, name) == int(iw.hash32(mixed)[0])
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_keys_follow_seed_and_canonical_name():
    idx = np.arange(1000)
    a = iw.expected_values(1024, "model.layers.1.self_attn.q_proj.weight", [100, 10], idx, 0.02, None)
    for wrapped in ("llm.model.layers.1.self_attn.q_proj.weight", "module.llm.model.layers.1.self_attn.q_proj.weight"):
        assert np.array_equal(iw.expected_values(1024, wrapped, [100, 10], idx, 0.02, None), a)
    assert not np.allclose(iw.expected_values(1025, "model.layers.1.self_attn.q_proj.weight", [100, 10], idx, 0.02,
                                              None), a)
    assert not np.allclose(iw.expected_values(1024, "model.layers.1.self_attn.k_proj.weight", [100, 10], idx, 0.02,
                                              None), a)
    assert len(set(iw.sample_indices(1024, "x", 10**6))) > 1000 * 0.99  # spread, not a few positions
    assert list(iw.sample_indices(1024, "x", 10)) == list(range(10))


FILL_AND_REPORT = """
import json, sys, torch, transformers
from framework_bench.worker import initial_weights_worker
cfg = json.loads(sys.argv[1]); run_dir = sys.argv[2]
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
model = transformers.AutoModelForCausalLM.from_config(config)
initial_weights_worker.fill(model, 1024, config.to_dict())
initial_weights_worker.report(model, 1024, run_dir)
"""


@pytest.fixture(scope="module")
def torch_filled(tmp_path_factory):
    """The torch twin's fill of a real HF Llama (tiny preset), read back from the live model."""
    env = backend_env_or_skip("torch")
    scn = scenario.load("tiny_cpu")
    run_dir = tmp_path_factory.mktemp("run")
    subprocess.run([str(env.python), "-c", FILL_AND_REPORT, json.dumps(scn.model_config_for_run), str(run_dir)],
                   check=True, timeout=300)
    return scn, json.loads((run_dir / iw.REPORT_FILE).read_text())


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_torch_twin_fills_what_the_host_computes(torch_filled):
    scn, report = torch_filled
    status, detail = iw.check(report, 1024, scn.model_config_for_run, expected_param_count(scn.arch))
    assert status == "pass", detail
    assert len(report["tensors"]) == 4 * 9 + 3  # per layer: 7 linears, 2 norms; embeddings, final norm, lm_head


def test_the_check_fails_a_changed_value_seed_or_missing_tensor(torch_filled):
    scn, report = torch_filled
    hf, count = scn.model_config_for_run, expected_param_count(scn.arch)
    changed = json.loads(json.dumps(report))
    changed["tensors"]["model.layers.2.mlp.down_proj.weight"]["values"][17] *= 1.001
    status, detail = iw.check(changed, 1024, hf, count)
    assert status == "fail" and "model.layers.2.mlp.down_proj.weight" in detail
    assert iw.check(report, 1025, hf, count)[0] == "fail"
    fewer = json.loads(json.dumps(report))
    del fewer["tensors"]["model.layers.3.self_attn.v_proj.weight"]
    status, detail = iw.check(fewer, 1024, hf, count)
    assert status == "fail" and "cover" in detail
    assert iw.check(None, 1024, hf, count)[0] == "unverified"
