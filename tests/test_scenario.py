"""Scenario validation: every shipped file loads; each invalid kind is rejected naming the field and the rule."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from typer.testing import CliRunner

from framework_bench.scenario import scenario
from framework_bench.scenario import catalog
from framework_bench.cli import app
from framework_bench.scenario.scenario import ScenarioError, load_file

runner = CliRunner()

# A valid GPU scenario; each test breaks exactly one rule of it.
BASE = {
    "model": {"preset": "llama2-7b"},
    "cluster": {"nodes": 1, "gpus_per_node": 8, "device": "cuda"},
    "context_length": 4096,
    "sequence_parallel": 1,
    "micro_batch": 1,
    "grad_accum": 1,
}


def flat(text: str) -> str:
    """Output with line wrapping undone (rich wraps long lines at the console width)."""
    return " ".join(text.split())


def write(tmp_path, name: str, data: dict):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def variant(**changes) -> dict:
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def test_base_is_valid(tmp_path):
    s = load_file(write(tmp_path, "base", BASE))
    assert s.name == "base"
    assert s.cluster.gpus == 8
    assert s.context_length == 4096


@pytest.mark.parametrize("path", scenario.scenario_paths(), ids=lambda p: p.stem)
def test_every_shipped_scenario_loads(path):
    s = load_file(path)
    assert s.name == path.stem
    assert s.cluster.gpus == s.cluster.nodes * s.cluster.gpus_per_node
    assert s.cluster.gpus % s.sequence_parallel == 0
    assert s.context_length % s.sequence_parallel == 0


def test_shipped_scenarios_include_cpu_ones():
    names = {p.stem for p in scenario.scenario_paths()}
    assert "tiny_cpu" in names
    cpu = [s for s in scenario.load_all() if s.cluster.device == "cpu"]
    assert len({s.context_length for s in cpu}) >= 3, "several CPU context lengths for a chart"


# (case id, changes, the field the message must name, a fragment of the rule)
INVALID = [
    ("sp_not_dividing_gpus", {"sequence_parallel": 16, "context_length": 4096},
     "sequence_parallel", "does not divide the GPU count 8"),
    ("context_not_divisible_by_sp", {"sequence_parallel": 8, "context_length": 4092},
     "context_length", "not divisible by sequence_parallel 8"),
    ("heads_not_divisible_by_sp", {"model.preset": "yi-34b-200k", "cluster.nodes": 2, "sequence_parallel": 16,
                                   "context_length": 32768},
     "num_attention_heads", "does not divide num_attention_heads 56"),
    ("gpus_not_nodes_x_per_node", {"cluster.nodes": 2, "cluster.gpus": 8},
     "gpus", "gpus 8 != nodes 2 x gpus_per_node 8"),
    ("micro_batch_zero", {"micro_batch": 0}, "micro_batch", "greater than 0"),
    ("context_zero", {"context_length": 0}, "context_length", "greater than 0"),
    ("grad_accum_negative", {"grad_accum": -2}, "grad_accum", "greater than 0"),
    ("nodes_zero", {"cluster.nodes": 0}, "cluster.nodes", "greater than 0"),
    ("sp_zero", {"sequence_parallel": 0}, "sequence_parallel", "greater than 0"),
    ("measured_steps_zero", {"steps.measured": 0}, "steps.measured", "greater than 0"),
    ("unknown_preset", {"model.preset": "llama9-1t"}, "model.preset", "unknown preset 'llama9-1t'"),
    ("typo_top_level", {"sequense_parallel": 2}, "sequense_parallel", "Extra inputs are not permitted"),
    ("typo_nested", {"cluster.gpu_per_node": 8}, "cluster.gpu_per_node", "Extra inputs are not permitted"),
    ("context_beyond_max_positions", {"context_length": 8192},
     "max_position_embeddings", "exceeds max_position_embeddings 4096; set extend_positions"),
    ("bad_shorthand", {"context_length": "8kb"}, "context_length", "not a length"),
    # the finetune axis
    ("lora_unknown_target", {"finetune": {"method": "lora", "rank": 8, "alpha": 16, "targets": ["q_proj", "lm_head"]}},
     "finetune.targets", "'lm_head' not a linear module of a llama decoder layer; valid: q_proj, k_proj, v_proj, "
                         "o_proj, gate_proj, up_proj, down_proj"),
    ("full_with_a_rank", {"finetune": {"method": "full", "rank": 8}}, "finetune",
     "method full trains every weight; only lora/qlora take rank"),
    ("qlora_fp32_base", {"finetune": {"method": "qlora", "rank": 8, "alpha": 16, "targets": "all-linear",
                                      "base_dtype": "fp32"}},
     "finetune", "method qlora stores the base in 4 bits (nf4), not fp32"),
    ("lora_quant_settings", {"finetune": {"method": "lora", "rank": 8, "alpha": 16, "targets": "all-linear",
                                          "double_quant": True}},
     "finetune", "only qlora takes double_quant"),
    ("lora_without_rank", {"finetune": {"method": "lora", "alpha": 16, "targets": "all-linear"}},
     "finetune", "method lora needs rank"),
    ("lora_rank_zero", {"finetune": {"method": "lora", "rank": 0, "alpha": 16, "targets": "all-linear"}},
     "finetune.rank", "greater than or equal to 1"),
    ("lora_alpha_zero", {"finetune": {"method": "lora", "rank": 8, "alpha": 0, "targets": "all-linear"}},
     "finetune.alpha", "greater than 0"),
    ("lora_dropout_one", {"finetune": {"method": "lora", "rank": 8, "alpha": 16, "dropout": 1.0, "targets": "all-linear"}},
     "finetune.dropout", "less than 1"),
    ("lora_no_targets", {"finetune": {"method": "lora", "rank": 8, "alpha": 16, "targets": []}},
     "finetune.targets", "at least 1 item"),
    ("lora_target_twice", {"finetune": {"method": "lora", "rank": 8, "alpha": 16, "targets": ["q_proj", "q_proj"]}},
     "finetune.targets", "names a module twice"),
    ("unknown_method", {"finetune": {"method": "dora"}}, "finetune.method", "'full', 'lora' or 'qlora'"),
]


@pytest.mark.parametrize("case,changes,field,rule", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_rejected_by_load_file(tmp_path, case, changes, field, rule):
    path = write(tmp_path, case, variant(**changes))
    with pytest.raises(ScenarioError) as exc:
        load_file(path)
    msg = str(exc.value)
    assert field in msg
    assert rule in msg
    assert str(path) in msg  # says which file


@pytest.mark.parametrize("case,changes,field,rule", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_rejected_by_cli_validate(tmp_path, case, changes, field, rule):
    good = write(tmp_path, "good", BASE)
    bad = write(tmp_path, case, variant(**changes))
    result = runner.invoke(app, ["validate", str(good), str(bad)])
    assert result.exit_code == 1, result.output
    out = flat(result.output)
    assert field in out and flat(rule) in out
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_validate_good_files_exit_zero(tmp_path):
    files = [write(tmp_path, "good", BASE), *scenario.scenario_paths()[:3]]
    result = runner.invoke(app, ["validate", *map(str, files)])
    assert result.exit_code == 0, result.output
    assert flat(result.output).count("ok ") == len(files)


def test_unknown_field_typo_is_the_only_error(tmp_path):
    """A typo is not silently dropped: `sequense_parallel: 2` must not load as SP 1."""
    with pytest.raises(ScenarioError) as exc:
        load_file(write(tmp_path, "typo", variant(sequense_parallel=2)))
    assert len(str(exc.value).splitlines()) == 1


def test_context_beyond_max_positions_accepted_with_extend_positions(tmp_path):
    s = load_file(write(tmp_path, "ext", variant(context_length=8192, extend_positions=True)))
    assert s.context_length == 8192 > s.arch.max_position_embeddings
    assert s.model_config_for_run["max_position_embeddings"] == 8192


@pytest.mark.parametrize("text,value", [
    ("8k", 8192), ("32k", 32768), ("128k", 131072), ("256K", 262144), ("1M", 1048576), ("1m", 1048576),
    (8192, 8192), ("4096", 4096), (131072, 131072),
])
def test_context_length_shorthand(tmp_path, text, value):
    data = variant(context_length=text, extend_positions=True)
    s = load_file(write(tmp_path, "short", data))
    assert s.context_length == value


@pytest.mark.parametrize("text", ["8kb", "1.5k", "k", "8g", "-8k", "eight", "", "1 M B"])
def test_bad_shorthand_rejected(tmp_path, text):
    with pytest.raises(ScenarioError, match=r"context_length"):
        load_file(write(tmp_path, "bad", variant(context_length=text, extend_positions=True)))


def test_name_must_match_file(tmp_path):
    with pytest.raises(ScenarioError, match=r"name: 'other' differs from the file name 'mine'"):
        load_file(write(tmp_path, "mine", {**BASE, "name": "other"}))


def test_several_errors_reported_one_line_each(tmp_path):
    path = write(tmp_path, "multi", variant(micro_batch=0, grad_accum=0, typo_key=1))
    with pytest.raises(ScenarioError) as exc:
        load_file(path)
    lines = str(exc.value).splitlines()
    assert len(lines) == 3
    assert {re.split(r": ", line)[1] for line in lines} == {"micro_batch", "grad_accum", "typo_key"}


def test_non_mapping_and_unreadable_files(tmp_path):
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ScenarioError, match="mapping"):
        load_file(p)
    with pytest.raises(ScenarioError, match="cannot read"):
        load_file(tmp_path / "missing.yaml")


def test_load_by_name_and_unknown_name():
    assert scenario.load("tiny_cpu").name == "tiny_cpu"
    with pytest.raises(ScenarioError, match="no scenario named 'nope'"):
        scenario.load("nope")


def test_cpu_scenarios_name_their_dataset_and_it_resolves_to_fbench_data(fbench_data):
    s = scenario.load("tiny_cpu")
    assert s.dataset.name == "alpaca-enzh-demo" and s.dataset.sources is None
    paths = [src.path for src in catalog.sources(s.dataset)]
    assert paths == [str(fbench_data / f) for f in ("alpaca_en_demo.json", "alpaca_zh_demo.json")]
