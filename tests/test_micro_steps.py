"""`steps.unit: micro`: measuring the giant rows in micro-iterations, recorded as such."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import backend_helpers as helpers
from backend_helpers import CPU, tiny
from fbench_fixtures import backend_env_or_skip

from framework_bench.plugins import registry as plugins
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.cli import app
from framework_bench.data.packing import pack
from framework_bench.store.results import ResultStore
from framework_bench.worker.files import read_metrics


def test_micro_steps_need_fewer_rows_and_lf_refuses_them():
    optimizer = tiny(grad_accum=4)
    micro = tiny(grad_accum=4, steps={"warmup": 1, "measured": 2, "unit": "micro"})
    assert optimizer.steps.unit == "optimizer" and optimizer.micro_per_step == 4 and micro.micro_per_step == 1
    assert micro.rows_needed == 3 and micro.tokens_per_gpu_step == 512
    env = helpers.ready_env("llamafactory", {"llamafactory": "0.9.5"}, "cpu")
    assert "steps.unit micro" in plugins.get("llamafactory").check(micro, CPU, env)


@pytest.mark.slow
def test_xtuner_measures_micro_iterations(tmp_path, monkeypatch):
    """A real XTuner run with grad_accum 4 measured per micro-iteration: one metrics line per
    iteration, the unit and tokens recorded, stored and listed."""
    backend_env_or_skip("xtuner")
    # six measured micro-iterations: long enough for the host to read their CPU share
    s = tiny(name="tiny_micro", grad_accum=4, steps={"warmup": 1, "measured": 6, "unit": "micro"})
    data = pack(s, progress=False, say=lambda msg: None)
    result = pipeline.run_one("xtuner", s, RunOptions(root=tmp_path), data=data, machine=CPU)
    assert result.status == "ok", result.reason
    steps = read_metrics(result.run_dir)
    assert [m["step"] for m in steps] == list(range(1, 8)) and all(m["tokens"] == 512 for m in steps)
    assert result.step_unit == "micro" and result.steps_measured == 6 and result.tokens_measured == 6 * 512
    assert any(f.startswith("per micro-iteration: 6 measured, 3,072 tokens/GPU") for f in result.flags)
    db = tmp_path / "results.sqlite"
    with ResultStore(db) as store:
        store.add(result, s)
        row = store.get(result.result_id)
    assert row["step_unit"] == "micro" and row["tokens_measured"] == 3072
    listed = CliRunner().invoke(app, ["results", "list", "--db", str(db)])
    assert listed.exit_code == 0 and "6 micro" in listed.stdout
