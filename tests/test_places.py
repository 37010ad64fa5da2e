"""Where fbench keeps its state and finds scenarios (framework_bench/scenario/places.py), installed
or from a checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from framework_bench.scenario import places, scenario

ROOT = Path(__file__).resolve().parents[1]


def test_state_folder_fbench_home_then_checkout_then_user_data(tmp_path, monkeypatch):
    monkeypatch.setenv("FBENCH_HOME", str(tmp_path / "home"))
    assert places.state_dir() == tmp_path / "home"
    monkeypatch.delenv("FBENCH_HOME")
    assert places.source_checkout() == ROOT and places.state_dir() == ROOT / ".fbench"
    # installed: the package's parent is a site-packages, with no pyproject naming fbench
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "pyproject.toml").write_text('[project]\nname = "something-else"\n')
    monkeypatch.setattr(places, "CHECKOUT", site)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert places.source_checkout() is None and places.state_dir() == tmp_path / "data" / "fbench"


def test_bundled_scenarios_are_package_data_and_the_users_come_on_top(tmp_path, monkeypatch):
    assert places.BUNDLED_SCENARIOS == ROOT / "framework_bench" / "scenarios"
    assert (ROOT / "scenarios").resolve() == places.BUNDLED_SCENARIOS  # the docs' path still works
    monkeypatch.setenv("FBENCH_HOME", str(tmp_path))
    mine = tmp_path / "scenarios"
    mine.mkdir()
    text = (places.BUNDLED_SCENARIOS / "tiny_cpu.yaml").read_text()
    (mine / "tiny_cpu.yaml").write_text(text.replace("description:", "description: mine;", 1))
    (mine / "my_own.yaml").write_text(text)
    names = [p.stem for p in scenario.scenario_paths()]
    assert names.count("tiny_cpu") == 1 and "my_own" in names and "yi34b_8k" in names
    assert scenario.source_path("tiny_cpu") == (mine / "tiny_cpu.yaml").resolve()
    assert scenario.load("tiny_cpu").description.startswith("mine;")
    with pytest.raises(scenario.ScenarioError, match="no scenario named 'nope'"):
        scenario.load("nope")
