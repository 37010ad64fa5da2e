"""Model families as data (scenario/families.py, scenario/models.py): every family's schema, its
parameters against the published sizes and against what transformers builds, a real model's
config.json as a scenario's model, the one error an unknown family or field gets, the FLOPs and
memory of a MoE (its active experts, every expert's states), and the refusal of an env whose
transformers lacks the family."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from framework_bench.measure import flops, memory, memory_terms
from framework_bench.scenario import scenario
from framework_bench.scenario.families import FAMILIES, transformers_refusal
from framework_bench.scenario.models import PRESETS, ModelArch, parameter_counts
from framework_bench.scenario.scenario import Scenario, ScenarioError, load_file

# Qwen/Qwen3-8B's config.json as published (transformers 4.51 wrote it)
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
# Qwen/Qwen2.5-7B's: a window use_sliding_window switches off
QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28, "model_type": "qwen2",
    "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": True, "use_sliding_window": False, "vocab_size": 152064,
}


def config_scenario(tmp_path, hf: dict, **model) -> Scenario:
    """A CPU scenario whose model is `hf` as a config.json beside it (named relatively), `model` the rest of it."""
    (tmp_path / "weights").mkdir(exist_ok=True)
    (tmp_path / "weights" / "config.json").write_text(json.dumps(hf))
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"model": {"config_file": "weights/config.json", **model},
                                    "cluster": {"device": "cpu"}, "context_length": 512}))
    return load_file(path)


# ---- sizes -------------------------------------------------------------------------------


@pytest.mark.parametrize("preset,total,active", [
    ("qwen3-8b", 8.2e9, None),  # the model card's 8.2 B
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),  # 30.5 B total, 3.3 B activated
    ("qwen2.5-7b", 7.61e9, None),
    ("mistral-7b", 7.25e9, None),
])
def test_preset_sizes_are_the_published_ones(preset, total, active):
    counts = parameter_counts(PRESETS[preset])
    assert counts["model"] == pytest.approx(total, rel=0.01)
    assert counts["active"] == pytest.approx(active or total, rel=0.02)


def test_moe_counts_by_hand():
    """Qwen3-30B-A3B: per layer q 2048 x 4096, k and v 2048 x 512, o 4096 x 2048, q/k norms 128
    each, two norms, a router 2048 x 128 and 128 experts of 3 x 2048 x 768 (8 of them active)."""
    counts = parameter_counts(PRESETS["qwen3-30b-a3b"])
    attention = 2048 * 4096 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 128
    layer = attention + 2 * 2048 + 2048 * 128 + 128 * 3 * 2048 * 768
    assert counts["layer"] == layer
    assert counts["model"] == 48 * layer + 2 * 151936 * 2048 + 2048 == 30_532_122_624
    assert counts["active"] == counts["model"] - 48 * 120 * 3 * 2048 * 768 == 3_353_032_704


def test_tied_embeddings_and_biases_are_counted_once():
    base = PRESETS["tiny-qwen3"].model_dump()
    tied = ModelArch(**{**base, "tie_word_embeddings": True})
    assert parameter_counts(tied)["model"] == parameter_counts(PRESETS["tiny-qwen3"])["model"] - 512 * 256
    biased = ModelArch(**{**base, "attention_bias": True})  # q 256, k and v 128 each, o 256, in 4 layers
    assert parameter_counts(biased)["model"] - parameter_counts(PRESETS["tiny-qwen3"])["model"] == 4 * (256 + 2 * 128 + 256)
    assert parameter_counts(PRESETS["qwen2.5-7b"])["attention"] == 2 * 3584 * 3584 + 2 * 3584 * 512 + 3584 + 2 * 512


def test_decoder_sparse_step_and_mlp_only_layers_pick_the_moe_layers():
    a = ModelArch(**{**PRESETS["tiny-qwen3-moe"].model_dump(), "num_hidden_layers": 6, "decoder_sparse_step": 2,
                     "mlp_only_layers": (3,)})
    assert a.moe_layers == (1, 5)  # layers 1, 3, 5 are every second; 3 is dense by name
    counts = parameter_counts(a)
    assert counts["layers"] == 4 * (counts["attention"] + counts["layer_norms"] + counts["dense_mlp"]) + 2 * (
        counts["attention"] + counts["layer_norms"] + counts["moe_mlp"])


# ---- the schema --------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_hf_config_names_the_family_class(preset):
    a = PRESETS[preset]
    cfg = a.hf_config()
    assert cfg["architectures"] == [FAMILIES[a.architecture].hf_class] and cfg["model_type"] == a.architecture
    assert ("head_dim" in cfg) == (a.head_dim is not None)
    assert ("num_experts" in cfg) == a.family.moe


def test_the_llama_config_is_what_it_was():
    """Runs of the Llama presets build what they built before families existed."""
    assert PRESETS["tiny-llama"].hf_config() == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 688, "vocab_size": 512,
        "rope_theta": 10000.0, "max_position_embeddings": 8192, "hidden_act": "silu", "rms_norm_eps": 1e-5,
        "initializer_range": 0.02, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
        "pad_token_id": 0}


@pytest.mark.parametrize("change,words", [
    ({"architecture": "gemma2"}, ["unknown model family 'gemma2'", "qwen3_moe"]),
    ({"num_experts": 8}, ["num_experts", "qwen3 is a dense family"]),
    ({"head_dim": None}, ["qwen3 needs head_dim"]),
    ({"architecture": "qwen3_moe"}, ["qwen3_moe needs num_experts, num_experts_per_tok, moe_intermediate_size"]),
    ({"architecture": "qwen2"}, ["attention_bias: not a field of qwen2"]),
    ({"sliding_window": 4096}, ["config.sliding_window", "Extra inputs"]),
])
def test_a_field_outside_the_family_is_one_error_naming_it(tmp_path, change, words):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"model": {"preset": "tiny-qwen3", "config": change}, "cluster": {"device": "cpu"},
                                    "context_length": 512}))
    with pytest.raises(ScenarioError) as e:
        load_file(path)
    assert len(str(e.value).splitlines()) == 1 and all(w in str(e.value) for w in words), str(e.value)


def test_lora_on_a_moe_targets_attention_only():
    s = scenario.load("qwen3_moe_tiny_cpu_lora")
    assert s.finetune.targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    data = {**s.model_dump(mode="json"), "finetune": {**s.finetune.model_dump(), "targets": ["gate_proj"]}}
    with pytest.raises(ValueError, match="'gate_proj' not a linear module of a qwen3_moe decoder layer"):
        Scenario.model_validate(data)


# ---- a real model's config.json ----------------------------------------------------------


def test_a_config_json_is_the_model_it_describes(tmp_path):
    s = config_scenario(tmp_path, QWEN3_8B)
    assert s.arch == PRESETS["qwen3-8b"]
    dumped = s.model_dump(mode="json")
    assert "config_file" not in dumped["model"]  # the fields read travel inline: the file is never read again
    (tmp_path / "weights" / "config.json").unlink()
    assert Scenario.model_validate(dumped).arch == s.arch
    assert config_scenario(tmp_path, QWEN25_7B).arch == PRESETS["qwen2.5-7b"]


def test_a_config_json_with_fields_overridden_and_as_transformers_5_writes_it(tmp_path):
    v5 = {k: v for k, v in QWEN3_8B.items() if k != "rope_theta"} | {
        "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}, "dtype": "bfloat16",
        "layer_types": ["full_attention"] * 36, "id2label": {"0": "LABEL_0"}, "return_dict": True}
    s = config_scenario(tmp_path, v5, config={"num_hidden_layers": 2})
    assert s.arch == ModelArch(**{**PRESETS["qwen3-8b"].model_dump(), "num_hidden_layers": 2})


@pytest.mark.parametrize("change,words", [
    ({"model_type": "gemma2"}, ["model_type 'gemma2' is not a family fbench builds"]),
    ({"architectures": ["Qwen3ForSequenceClassification"]}, ["is not qwen3's causal LM"]),
    ({"foo_bar": 1}, ["field 'foo_bar' is not one fbench knows"]),
    ({"use_sliding_window": True}, ["use_sliding_window = True: sliding-window attention"]),
    ({"hidden_act": "gelu"}, ["hidden_act = 'gelu'"]),
    ({"rope_scaling": {"rope_type": "yarn"}, "attention_dropout": 0.1}, ["attention_dropout = 0.1"]),
])
def test_a_config_json_fbench_would_not_build_as_it_says_is_one_error_naming_the_field(tmp_path, change, words):
    with pytest.raises(ScenarioError) as e:
        config_scenario(tmp_path, QWEN3_8B | change)
    assert len(str(e.value).splitlines()) == 1 and all(w in str(e.value) for w in words), str(e.value)
    assert "weights/config.json" in str(e.value)


def test_mistral_v01s_sliding_window_is_refused(tmp_path):
    v01 = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
           "max_position_embeddings": 32768, "rope_theta": 10000.0, "rms_norm_eps": 1e-05, "vocab_size": 32000,
           "sliding_window": 4096}
    with pytest.raises(ScenarioError, match="sliding_window = 4096: sliding-window attention"):
        config_scenario(tmp_path, v01)
    assert config_scenario(tmp_path, v01 | {"sliding_window": None}).arch.architecture == "mistral"


# ---- FLOPs and memory of a MoE -----------------------------------------------------------


def test_moe_flops_count_the_routed_experts():
    """tiny-qwen3-moe: per layer and token, q 256 x 256, k and v 256 x 128, o 256 x 256, the router
    256 x 8 and 2 of 8 experts of 3 x 256 x 128; attention over q's 256; the head 512 x 256."""
    a, s = PRESETS["tiny-qwen3-moe"], 512
    linears = 256 * 256 + 2 * 256 * 128 + 256 * 256 + 256 * 8 + 2 * 3 * 256 * 128
    attention = 2 * 2 * (s + 1) / 2 * 256
    for recompute, passes in ((False, 3), (True, 4)):
        assert flops.model_flops_per_token(a, s, recompute) == passes * 4 * (2 * linears + attention) + 6 * 512 * 256
    # XTuner's formula counts the same routed MLP (its 4 r h^2 is two FLOPs a weight of it)
    mlp = 256 * 8 + 2 * 3 * 256 * 128
    assert flops.mha_flops_per_token(a, s, False) == 3 * 4 * (8 * 256 * 256 + 4 * s * 256 / 2 + 2 * mlp) + 6 * 256 * 512


def test_moe_memory_holds_every_expert_and_the_routed_tokens_activations():
    s = scenario.load("qwen3_30b_a3b_8k")
    e = memory.estimate(s)
    n = parameter_counts(s.arch)["model"]
    assert (e.scheme, e.zero_stage, e.sharding_group) == ("deepspeed", 3, 8)
    assert e.parameters_gib == round(2 * n / 8 / memory_terms.GIB, 3)  # bf16, every expert, sharded over 8
    assert e.optimizer_states_gib == round(12 * n / 8 / memory_terms.GIB, 3)
    # a MoE layer's saved tensors: attention as a dense layer's; the router's 8 x 128 and, per token, 8
    # experts' gathered input and output (4h) and their 8 x 768 intermediate
    h, q, kv = 2048, 4096, 512
    per_token = memory_terms.layer_activation_bytes_per_token(s.arch, "deepspeed", moe=True)
    assert per_token == 16 * h + 6 * q + 4 * kv + 8 * (q + kv) + 8 * 128 + 8 * (4 * h + 8 * 768)


# ---- which env can build it --------------------------------------------------------------


def test_an_env_whose_transformers_lacks_the_family_or_its_expert_layout_refuses_it():
    reason = transformers_refusal("qwen3", "4.48.0")
    assert reason == ("qwen3 models (Qwen3ForCausalLM) need transformers >= 4.51.0; this env has transformers "
                      "4.48.0, which has no qwen3")
    assert transformers_refusal("qwen2", "4.48.0") is None
    # a MoE the env has, but with an expert module each: the initial weights could not be the reference's
    assert "each expert is a module of its own, where transformers >= 5.0.0" in transformers_refusal("qwen2_moe", "4.48.0")
    assert transformers_refusal("qwen3", "4.51.0.dev0") is None and transformers_refusal("qwen3_moe", "5.6.0") is None
    assert transformers_refusal("qwen3", None) is None  # an env that builds without transformers: its plugin's call


@pytest.mark.parametrize("name,refused", [("qwen3_tiny_cpu", True), ("qwen3_moe_tiny_cpu", True), ("tiny_cpu", False)])
def test_xtuner_refuses_qwen3_by_its_envs_transformers(name, refused):
    from backend_helpers import CPU
    from fbench_fixtures import backend_env_or_skip

    from framework_bench.plugins import registry
    from framework_bench.run.refusals import refusals_for

    env = backend_env_or_skip("xtuner")
    check = refusals_for(registry.get("xtuner"), scenario.load(name), CPU, env)[1].check
    assert (check is not None and "need transformers >= 4.51.0; this env has transformers 4.48.0" in check) == refused


def test_the_backends_build_the_family_they_are_given(tmp_path):
    """ms-swift is told the family's model type, never Llama's; TRL's SFTConfig, which switches the
    router's aux loss on whenever the config's coefficient is non-zero, gets 0 where the config's
    output_router_logits keeps it out of the loss (the referee found TRL's MoE losses 3.5e-4 off)."""
    from backend_helpers import make_job
    from fbench_swift.swift_args import sft_args
    from fbench_trl.sft_args import sft_config

    moe = scenario.load("qwen3_moe_tiny_cpu")
    assert sft_args(make_job("swift", tmp_path / "s", moe), None, "sdpa")["model_type"] == "qwen3_moe"
    assert sft_config(make_job("trl", tmp_path / "t", moe), None)["router_aux_loss_coef"] == 0.0
    with_aux = moe.model_copy(update={"model": moe.model.model_copy(update={"config": {"output_router_logits": True}})})
    assert sft_config(make_job("trl", tmp_path / "a", with_aux), None)["router_aux_loss_coef"] == 0.001
    assert "router_aux_loss_coef" not in sft_config(make_job("trl", tmp_path / "d", scenario.load("qwen3_tiny_cpu")), None)


# ---- built for real ----------------------------------------------------------------------

COUNT = """
import json, sys, torch, transformers
for name, cfg in json.loads(sys.argv[1]).items():
    cfg = dict(cfg)
    try:
        config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    except ValueError:
        print(name, "unknown"); continue
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    print(name, type(model).__name__, sum(p.numel() for p in model.parameters()))
"""


@pytest.mark.slow  # two backend envs' transformers, every preset built on the meta device (~15 s)
def test_every_family_builds_with_the_parameters_counted_here():
    from fbench_fixtures import backend_env_or_skip

    archs = dict(PRESETS) | {
        "qwen2-moe-shared": ModelArch(architecture="qwen2_moe", hidden_size=256, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, intermediate_size=688,
                                      vocab_size=512, rope_theta=1e6, max_position_embeddings=8192, num_experts=8,
                                      num_experts_per_tok=2, moe_intermediate_size=128,
                                      shared_expert_intermediate_size=256, decoder_sparse_step=2, mlp_only_layers=(0,)),
        "tied-biased": ModelArch(**{**PRESETS["tiny-qwen3"].model_dump(), "tie_word_embeddings": True,
                                    "attention_bias": True}),
    }
    configs = json.dumps({name: a.hf_config() for name, a in archs.items()})
    for backend, lacking in (("torch", set()), ("xtuner", {"qwen3", "qwen3_moe"})):
        env = backend_env_or_skip(backend)
        done = subprocess.run([str(env.python), "-c", COUNT, configs], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        built = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
        for name, a in archs.items():
            if a.architecture in lacking:
                assert built[name] == ["unknown"], (backend, name)
            else:
                assert built[name] == [a.family.hf_class, str(parameter_counts(a)["model"])], (backend, name)


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """The torch reference's real runs of the tiny Qwen3 and Qwen3-MoE, one warm-up and two
    measured steps each (about 15 s together on an idle machine)."""
    from backend_helpers import CPU
    from fbench_fixtures import backend_env_or_skip

    from framework_bench.data.packing import pack
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.scenario.scenario import Steps

    backend_env_or_skip("torch")
    root, runs = tmp_path_factory.mktemp("family-runs"), {}
    for name in ("qwen3_tiny_cpu", "qwen3_moe_tiny_cpu"):
        # 4 measured steps: at ~0.1 s a step, 2 left the run at the CPU check's 0.2 s edge (unverified in CI)
        s = scenario.load(name).model_copy(update={"steps": Steps(warmup=1, measured=4)})
        runs[name] = s, pipeline.run_one("torch", s, RunOptions(root=root),
                                         data=pack(s, progress=False, say=lambda msg: None), machine=CPU)
    return runs


@pytest.mark.slow  # the torch reference trains each family
@pytest.mark.parametrize("name", ["qwen3_tiny_cpu", "qwen3_moe_tiny_cpu"])
def test_the_reference_trains_the_family_it_was_given(reference_runs, name):
    s, result = reference_runs[name]
    assert result.status == "ok", result.reason
    checks = {c.name: c for c in result.checks}
    # the built model has the family's count (a Llama of the same shapes has no q/k norms, a dense one no experts)
    assert checks["parameters"].status == "pass"
    assert checks["parameters"].detail == f"{parameter_counts(s.arch)['model']:,} parameters"
    assert checks["initial_weights"].status == "pass" and checks["update"].status == "pass"
    job = json.loads((result.run_dir / "job.json").read_text())
    assert job["hf_config"]["architectures"] == [FAMILIES[s.arch.architecture].hf_class]


# The tiny Qwen3-MoE with the router's auxiliary loss in its training loss, at a coefficient whose
# share of the loss (about 0.1 x 2 against a cross-entropy of about 5.6) is far over fp32 parity's bound.
AUX_ON = {"output_router_logits": True, "router_aux_loss_coef": 0.1}
# What a loss without the aux loss fails: the losses, and the weights it moves (the router's)
PARITY_CHECKS = {"parity", "update_parity", "update_parts", "warmup_update_parity"}


@pytest.fixture(scope="module")
def aux_loss_runs(liars, tmp_path_factory):
    """One compare on the tiny Qwen3-MoE with the aux loss on: a copy of the torch worker whose
    forward drops it (its ledger still saying the scenario's coefficient), torch the reference."""
    from backend_helpers import tiny
    from framework_bench.run import compare
    from framework_bench.run.options import RunOptions

    s = tiny(name="qwen3_moe_tiny_cpu_aux", model={"preset": "tiny-qwen3-moe", "config": AUX_ON},
             steps={"warmup": 1, "measured": 3})
    results = compare.compare([s], ["lying_drops_router_aux_loss"], RunOptions(root=tmp_path_factory.mktemp("aux")),
                              warmup_rounds=0)
    return s, {r.backend: r for r in results}


@pytest.mark.slow  # real runs of the torch worker and its copy
def test_a_worker_dropping_the_routers_aux_loss_its_ledger_claims_is_invalid_and_live_without_parity(
        aux_loss_runs, monkeypatch):
    from backend_helpers import judged_again

    s, results = aux_loss_runs
    reference, lie = results["torch"], results["lying_drops_router_aux_loss"]
    assert reference.status == "ok", reference.reason
    for r in (reference, lie):  # both ledgers: the aux loss joins the training loss at the scenario's coefficient
        assert r.settings["router_aux_loss_coef"] == AUX_ON["router_aux_loss_coef"], r.settings
    assert lie.status == "invalid" and "parity check failed" in lie.reason, lie.reason
    failed = {c.name for c in lie.checks if c.status == "fail"}
    assert "parity" in failed and failed <= PARITY_CHECKS, failed
    again = judged_again(lie, reference, s, monkeypatch, ",".join(sorted(PARITY_CHECKS)))
    assert again.status == "ok", again.reason
