"""LoRA end to end: `fbench compare --scenario tiny_cpu_lora` with the real
trainers and the torch reference (peft in each env), in matched and in native mode: the
trainable counts the host computed, step-1 loss parity, the base unchanged and the adapters
moved, every LoRA setting in the ledger as each worker read it off its live model.
One compare per mode, shared by the module's tests."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fbench_fixtures import backend_env_or_skip
from framework_bench.cli import app
from framework_bench.envs import venvs as envs
from framework_bench.present import differences
from framework_bench.scenario import scenario

BACKENDS = ("xtuner", "llamafactory", "trl", "swift")
TARGETS = "down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"
MATCHED_LORA = {"finetune_method": "lora", "lora_targets": TARGETS, "lora_head_adapted": False, "lora_rank": 8,
                "lora_alpha": 16.0, "lora_scale": 2.0, "lora_dropout": 0.0, "lora_rslora": False, "lora_dora": False,
                "base_dtype": "float32", "base_frozen": True}


def _compare(tmp_path_factory, mode: str) -> tuple[dict, dict, Path]:
    for name in (*BACKENDS, "torch"):
        backend_env_or_skip(name)
    root = tmp_path_factory.mktemp(f"lora_{mode}")
    home = root / "home"
    home.mkdir()
    (home / "envs").symlink_to((envs.fbench_home() / "envs").resolve())
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FBENCH_HOME", str(home))
        res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu_lora", "--backends", ",".join(BACKENDS),
                                       "--settings", mode, "--db", str(root / "results.sqlite"),
                                       "--out", str(root / "plots"), "--json", "--timeout", "900"])
    assert res.exit_code == 0, res.output
    records = json.loads(res.stdout)["runs"]
    return {r["backend"]: r for r in records}, differences.setting_differences(records).get("tiny_cpu_lora", []), root


@pytest.fixture(scope="module")
def matched(tmp_path_factory):
    return _compare(tmp_path_factory, "matched")


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    return _compare(tmp_path_factory, "native")


def _check(record: dict, name: str) -> dict:
    return next(c for c in record["checks"] if c["name"] == name)


@pytest.mark.slow
def test_matched_lora_is_ok_for_every_backend_with_the_same_adapters_and_parity(matched):
    records, _, _ = matched
    s = scenario.load("tiny_cpu_lora")
    adapters = s.finetune.adapter_parameter_count(s.arch)
    assert set(records) == {*BACKENDS, "torch"}
    for name, r in records.items():
        assert r["status"] == "ok", (name, r["reason"])
        live = r["settings"]
        assert {k: live.get(k) for k in MATCHED_LORA} == MATCHED_LORA, name
        assert live["trainable_params"] == adapters, name
        assert _check(r, "trainable")["status"] == "pass"
        update = _check(r, "update")
        assert update["status"] == "pass" and "base unchanged" in update["detail"], name
        assert update["figures"]["adapters_norm"] > 0.0, name
    for name in BACKENDS:
        parity = _check(records[name], "parity")
        assert parity["status"] == "pass", (name, parity["detail"])
        step1 = abs(records[name]["loss_curve"]["1"] - records["torch"]["loss_curve"]["1"])
        assert step1 <= 1e-5 * abs(records["torch"]["loss_curve"]["1"]), name
        assert _check(records[name], "update_parity")["status"] == "pass", name


@pytest.mark.slow
def test_the_compare_of_both_real_trainers_stores_one_row_each_on_one_stream_and_charts_them(matched):
    """The CLI's compare with both real trainers, as the README's main job runs it: a row each
    (the reference's too) on the same packed data, each framework's line in the chart, the report."""
    _, _, root = matched
    rows = sqlite3.connect(root / "results.sqlite").execute("SELECT backend, status, data_sha256 FROM runs").fetchall()
    assert sorted(r[:2] for r in rows) == [("llamafactory", "ok"), ("swift", "ok"), ("torch", "ok"), ("trl", "ok"), ("xtuner", "ok")]
    assert len({r[2] for r in rows}) == 1
    (png,) = (root / "plots").glob("tgs_tflops_*.png")
    assert png.stat().st_size > 10_000
    svg = png.with_suffix(".svg").read_text()
    assert all(f"line-{name}" in svg for name in BACKENDS)
    assert "tiny_cpu_lora" in (root / "plots" / "report.md").read_text()


@pytest.mark.slow
def test_matched_lora_leaves_no_adapter_setting_different(matched):
    _, differences, _ = matched
    assert not [key for key, _, _ in differences if key.startswith("lora_") or key in (
        "trainable_params", "base_dtype", "adapter_dtype", "base_frozen", "finetune_method")], differences


@pytest.mark.slow
def test_native_lora_names_each_frameworks_defaults_as_differences(native):
    records, differences, _ = native
    differ = {key: values for key, values, _ in differences}
    # XTuner's own LoRA defaults (r=64, alpha 16, dropout 0.1) against LLaMA-Factory's (r=8,
    # alpha 16, dropout 0) and the reference's (the scenario's)
    assert differ["lora_rank"]["xtuner"] == 64 and differ["lora_rank"]["llamafactory"] == 8
    assert differ["lora_dropout"]["xtuner"] == 0.1
    assert "lora_scale" in differ and "trainable_params" in differ
    xt = records["xtuner"]["settings"]
    # XTuner's configs' adapters on every linear but the head, and its fp32 upcast kept (named in its notes)
    assert (xt["lora_alpha"], xt["lora_scale"], xt["lora_targets"], xt["lora_head_adapted"], xt["base_dtype"]) == (
        16.0, 0.25, TARGETS, False, "float32")
    s = scenario.load("tiny_cpu_lora")
    assert xt["trainable_params"] == s.finetune.model_copy(update={"rank": 64}).adapter_parameter_count(s.arch)
    assert records["llamafactory"]["settings"]["trainable_params"] == s.finetune.adapter_parameter_count(s.arch)
    # TRL has no adapter defaults: peft's LoraConfig's (r 8, alpha 8, q_proj and v_proj for Llama), named in its notes
    trl = records["trl"]["settings"]
    assert (trl["lora_rank"], trl["lora_alpha"], trl["lora_targets"]) == (8, 8.0, "q_proj,v_proj")
    assert trl["trainable_params"] == s.finetune.model_copy(update={"targets": ["q_proj", "v_proj"]}).adapter_parameter_count(s.arch)
    assert any("peft's LoraConfig defaults" in note for note in records["trl"]["notes"])
    # ms-swift's own (r 8, alpha 32, dropout 0.05, every linear), named in its notes
    sw = records["swift"]["settings"]
    assert (sw["lora_rank"], sw["lora_alpha"], sw["lora_dropout"], sw["lora_targets"]) == (8, 32.0, 0.05, TARGETS)
    assert any("ms-swift's own LoRA defaults" in note for note in records["swift"]["notes"])
    for name, r in records.items():
        assert r["status"] == "ok", (name, r["reason"])
        assert _check(r, "trainable")["status"] == "pass", name  # counted from the rank and targets it holds
    parity = _check(records["xtuner"], "parity")
    assert parity["status"] == "pass" and "native defaults" in parity["detail"]
    assert _check(records["xtuner"], "update_parity")["status"] == "skipped"
