"""Shared fixtures for the core tests. Kept minimal on purpose."""

from __future__ import annotations

from pathlib import Path

import pytest

# The shared Alpaca files the CPU scenarios pack (../shared/data/alpaca from the repo root).
ALPACA_DIR = Path(__file__).resolve().parents[1].parent / "shared/data/alpaca"


@pytest.fixture
def fbench_home(tmp_path, monkeypatch) -> Path:
    """A private FBENCH_HOME, so a test never writes into the repo's .fbench or ../shared."""
    home = tmp_path / "fbench_home"
    monkeypatch.setenv("FBENCH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def alpaca_dir() -> Path:
    assert (ALPACA_DIR / "alpaca_en_demo.json").is_file(), f"shared Alpaca data missing at {ALPACA_DIR}"
    return ALPACA_DIR


def backend_env_or_skip(name: str):
    """The ready env of backend `name`. Missing: skipped on a developer machine, but a
    failure under CI, whose setup creates every env (a skip must never pass as a result)."""
    import os

    from framework_bench import envs, plugins

    env = envs.inspect(name, plugins.get(name).info.env)
    if not env.ready:
        message = f"{name} env {env.problem}; `fbench env create {name}` makes it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return env
