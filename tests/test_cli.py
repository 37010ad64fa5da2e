"""The `fbench` command line through typer's test runner, and its import weight."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing

import pytest
import typer
from typer.testing import CliRunner

from framework_bench.measure import flops
from framework_bench.scenario import scenario
from framework_bench.cli import app

runner = CliRunner()

PUBLISHED = [
    "llama2_7b_8k", "llama2_7b_32k", "llama2_7b_128k", "llama2_7b_256k", "llama2_7b_1m",
    "yi34b_8k", "yi34b_32k", "yi34b_128k", "yi34b_256k",
    "llama2_70b_8k", "llama2_70b_32k", "llama2_70b_128k", "llama2_70b_256k", "llama2_70b_1m",
]


def flat(text: str) -> str:
    return " ".join(text.split())


def test_help_lists_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for cmd in ("scenarios", "show", "validate", "schema", "pack", "backends", "run", "env"):
        assert cmd in result.output


def _command_paths(command, path=()):
    """The words that call `command` and each command under it, itself first."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_every_help_says_its_values_in_words_with_an_example():
    """Not `<int range> [0<=x<=4294967295]`: no type names (`<str>`, `<bool>`), no click ranges;
    and each command's help shows one example of it."""
    paths = list(_command_paths(typer.main.get_command(app)))
    assert ("results", "list") in paths and ("diff",) in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        typed = re.search(r"<[a-z][\w\[\], |]*>|x>=|<=x|x<=", result.output)
        assert typed is None, (path, typed)
        assert f"Example: {' '.join(('fbench', *path))}" in flat(result.output), (path, result.output)


def _typer_commands(app_, path=()):
    for command in app_.registered_commands:
        yield (*path, command.name or command.callback.__name__), command.callback
    for group in app_.registered_groups:
        yield from _typer_commands(group.typer_instance, (*path, group.name))


def test_every_option_declares_its_names():
    """Typer 0.27 (the one-GPU machine's 0.27.2) names an option without declared names after its
    metavar where the metavar is the parameter upper-cased (`--FLAVOUR`), so `--flavour` fails."""
    undeclared = []
    for path, callback in _typer_commands(app):
        for name, hint in typing.get_type_hints(callback, include_extras=True).items():
            for info in getattr(hint, "__metadata__", ()):
                declared = info.param_decls or (isinstance(info.default, str) and info.default.startswith("-"))
                if isinstance(info, typer.models.OptionInfo) and not declared:
                    undeclared.append((*path, name))
    assert ("env", "create") in [p for p, _ in _typer_commands(app)]
    assert undeclared == []


@pytest.mark.parametrize("args, said", [
    (["compare", "--scenario", "tiny_cpu", "--seed", "4294967296"],
     "'--seed': must be a whole number from 0 to 4,294,967,295 (a 32-bit seed)"),
    (["run", "--backend", "torch", "--scenario", "tiny_cpu", "--seed", "-1"], "'--seed': must be a whole number from 0"),
    (["compare", "--scenario", "tiny_cpu", "--cpus-per-task", "0"], "'--cpus-per-task': must be a whole number, 1 or more"),
    (["compare", "--scenario", "tiny_cpu", "--warmup-rounds", "-1"], "'--warmup-rounds': must be a whole number, 0 or more"),
    (["results", "collect", "--poll", "nan"], "'--poll': must be a number, 0.1 or more (seconds)"),
    (["diff", "--fail-if-slower", "-0.5"], "'--fail-if-slower': must be a number, 0 or more (percent)"),
    (["results", "list", "--limit", "0"], "'--limit': must be a whole number, 1 or more"),
])
def test_a_number_out_of_its_range_is_refused_in_words(fbench_home, args, said):
    result = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 2 and said in result.output, result.output


def test_scenarios_lists_published_and_cpu():
    result = runner.invoke(app, ["scenarios"])
    assert result.exit_code == 0, result.output
    names = set(re.findall(r"^\W*([a-z0-9_]+)\s", result.output, flags=re.M))
    assert set(PUBLISHED) <= names
    assert {"tiny_cpu"} | {p.stem for p in scenario.scenario_paths() if p.stem.startswith("tiny_cpu")} <= names
    assert "invalid" not in result.output
    row = next(l for l in result.output.splitlines() if re.search(r"\byi34b_128k\b", l))
    assert "32" in row and "128k" in row and "251.1" in row


def test_scenarios_table_shows_an_invalid_file_without_crashing(tmp_path, monkeypatch):
    (tmp_path / "good.yaml").write_text(scenario.SCENARIO_DIR.joinpath("tiny_cpu.yaml").read_text())
    (tmp_path / "bad.yaml").write_text("model: {preset: nope}\ncontext_length: 512\n")
    monkeypatch.setattr(scenario, "SCENARIO_DIR", tmp_path)
    monkeypatch.setattr(scenario.scenario_paths, "__defaults__", (tmp_path,))
    result = runner.invoke(app, ["scenarios"])
    assert result.exit_code == 0, result.output
    assert "good" in result.output and "invalid" in result.output


def test_show_json_yi34b_128k():
    result = runner.invoke(app, ["show", "yi34b_128k", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["name"] == "yi34b_128k"
    assert info["gpus"] == 32
    assert info["context_length"] == 131072
    assert info["sequence_parallel"] == 8
    assert info["reference"]["tgs"] == 251.1
    assert info["reference"]["tflops"] == 191.8
    xt, model = info["flops"]["xtuner_per_token"], info["flops"]["model_per_token"]
    assert flops.tflops(info["reference"]["tgs"], xt) == pytest.approx(191.8, rel=0.01)
    assert model < xt  # GQA: the exact count is below XTuner's formula
    # the figures are the FLOPs module's, for this scenario's architecture
    s = scenario.load("yi34b_128k")
    assert xt == pytest.approx(flops.mha_flops_per_token(s.arch, 131072, True))
    assert model == pytest.approx(flops.model_flops_per_token(s.arch, 131072, True))


def test_show_text():
    result = runner.invoke(app, ["show", "llama2_7b_1m"])
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "llama2_7b_1m" in out and "SP 16" in out and "= 32" in out
    assert "133.6" in out and "153.9" in out


def test_show_unknown_is_one_error_line():
    result = runner.invoke(app, ["show", "nope"])
    assert result.exit_code != 0
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("error: no scenario named 'nope'")
    assert "tiny_cpu" in lines[0]  # says what exists


def test_show_bad_file_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: llama2-7b}\ncontext_length: 512\nmicro_batch: 0\n")
    result = runner.invoke(app, ["show", str(bad)])
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    assert "micro_batch" in result.stderr and "greater than 0" in flat(result.stderr)


def test_validate_good_and_bad(tmp_path):
    good = scenario.SCENARIO_DIR / "yi34b_128k.yaml"
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0 and "ok" in result.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: {preset: llama2-7b}\ncluster: {gpus_per_node: 8}\ncontext_length: 4096\nsequence_parallel: 3\n")
    result = runner.invoke(app, ["validate", str(good), str(bad)])
    assert result.exit_code == 1
    err = flat(result.stderr)
    assert "sequence_parallel 3 does not divide the GPU count 8" in err
    assert "Traceback" not in result.output


def test_schema_is_json_schema():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    props = schema["properties"]
    assert "context_length" in props and "sequence_parallel" in props and "model" in props
    assert set(schema["required"]) >= {"name", "model", "context_length"}
    assert schema.get("additionalProperties") is False  # unknown keys are rejected


def test_pack_twice_same_sha(fbench_home):
    shas = []
    for attempt in range(2):
        result = runner.invoke(app, ["pack", "tiny_cpu"])
        assert result.exit_code == 0, result.output
        out = flat(result.output)
        m = re.search(r"rows ([\d,]+) x 512 = ([\d,]+) tokens, ([\d,]+) documents", out)
        assert m, out
        rows, tokens, docs = (int(g.replace(",", "")) for g in m.groups())
        assert rows * 512 == tokens and docs > 1000
        shas.append(re.search(r"sha256 ([0-9a-f]{64})", out).group(1))
        assert ("reused" if attempt else "packed") in out
        assert str(fbench_home) in out
    assert shas[0] == shas[1]
    manifests = list((fbench_home / "data").glob("*/manifest.json"))
    assert len(manifests) == 1 and json.loads(manifests[0].read_text())["sha256"] == shas[0]


def test_pack_unknown_scenario(fbench_home):
    result = runner.invoke(app, ["pack", "nope"])
    assert result.exit_code == 1
    assert "no scenario named 'nope'" in result.stderr and "Traceback" not in result.output
    assert not (fbench_home / "data").exists()


def test_pack_missing_alpaca_file_is_one_error(tmp_path, fbench_home):
    f = tmp_path / "nodata.yaml"
    f.write_text("model: {preset: tiny-llama}\ncluster: {device: cpu}\ncontext_length: 512\n"
                 f"dataset: {{sources: [{{path: {tmp_path / 'missing.json'}}}]}}\n")
    result = runner.invoke(app, ["pack", str(f)])
    assert result.exit_code == 1
    assert isinstance(result.exception, SystemExit)
    assert "cannot read Alpaca file" in flat(result.stderr) and "Traceback" not in result.output


@pytest.mark.parametrize("args", [["scenarios"], ["show", "tiny_cpu", "--json"]])  # rich's table; print()'s JSON
@pytest.mark.parametrize("stdout", [">&-", ">/dev/full"])
def test_a_closed_or_full_stdout_is_one_line_on_stderr(args, stdout):
    """A closed stdout failed at import (sys.stdout is None), a full one in a traceback from rich
    or from the interpreter's last flush."""
    fbench = f"{sys.executable} -c 'from framework_bench.cli import app; app()' {' '.join(args)}"
    out = subprocess.run(f"{fbench} {stdout}", shell=True, stderr=subprocess.PIPE, text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert lines[0].startswith("error: ") and "standard output" in lines[0], lines


HEAVY = ("torch", "transformers", "xtuner", "llamafactory", "matplotlib", "datasets", "deepspeed")


def test_cli_import_is_light():
    """Nor numpy: `fbench --help` stays quick (0.25 s measured; the limit is 0.3 s)."""
    code = ("import framework_bench.cli, sys; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY + ('numpy',)!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_scenario_commands_stay_light():
    """`show` and `scenarios` run without importing torch/frameworks/matplotlib either."""
    code = ("import sys; from typer.testing import CliRunner; from framework_bench.cli import app; "
            "r = CliRunner().invoke(app, ['show', 'yi34b_128k', '--json']); assert r.exit_code == 0; "
            "r = CliRunner().invoke(app, ['scenarios']); assert r.exit_code == 0; "
            f"print(sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

