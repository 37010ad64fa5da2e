"""Helpers the backend plugin tests share: machines, a ready env, tiny scenarios, jobs."""

from __future__ import annotations

import re
from pathlib import Path

from framework_bench.scenario import scenario
from framework_bench.plugins.contract import BackendEnv, Job, Machine

CPU = Machine(gpus=0, cpu_count=2)
H100x8 = Machine(gpus=8, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=80)


def ready_env(name: str, versions: dict[str, str], flavour: str, *extra: str) -> BackendEnv:
    """An env as `envs.inspect` reports a finished one, with the distributions named installed."""
    return BackendEnv(name=name, path=Path("/nonexistent"), python=Path("/nonexistent/bin/python"),
                      flavour=flavour, ready=True, versions={"torch": "2.13.0", **versions, **{d: "1" for d in extra}})


def contributing_backend() -> tuple[str, str]:
    """(worker.py, plugin.py) of the minimal backend CONTRIBUTING.md shows, as written there."""
    text = (Path(__file__).resolve().parents[1] / "CONTRIBUTING.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    return (next(b for b in blocks if "def main" in b), next(b for b in blocks if "class MyBackend(Backend)" in b))


# The two forms of the minimal plugin, by the entry point each is registered under: today's
# CONTRIBUTING (a Backend subclass) and CONTRIBUTING's before the base class (module-level
# hooks, contract 1), which must keep working unchanged.
PLUGIN_FORMS = {
    "base class": ("fbench_mybackend.plugin:MyBackend", lambda: contributing_backend()[1]),
    "module hooks": ("fbench_mybackend.plugin",
                     lambda: (Path(__file__).parent / "contract1_backend" / "plugin.py").read_text()),
}


def hooks_of(module) -> object:
    """What the registry registers for the plugin module: its Backend subclass's instance, or the module."""
    from framework_bench.plugins.base import Backend

    classes = [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, Backend) and v is not Backend]
    return classes[0]() if classes else module


def tiny(**fields) -> scenario.Scenario:
    base = {"name": "tiny_variant", "model": {"preset": "tiny-llama"}, "context_length": 512,
            "cluster": {"device": "cpu"}, "precision": "fp32", "activation_checkpointing": False}
    return scenario.Scenario.model_validate({**base, **fields})


def make_job(backend: str, tmp_path: Path, scn: scenario.Scenario) -> Job:
    """A job over a stand-in packed folder (plans read only its tokenizer files)."""
    data_dir = tmp_path / "packed"
    (data_dir / "tokenizer").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (data_dir / "tokenizer" / name).write_text("{}")
    c = scn.cluster
    return Job(backend=backend, scenario=scn, data_dir=data_dir, data_sha256="0" * 64,
               run_dir=tmp_path / "run", device=c.device, nprocs=c.gpus_per_node, nnodes=c.nodes)


def train_tiny_cpu(backend: str, tmp_path: Path, framework_version: str, settings_mode: str = "matched",
                   shared=None):
    """Train `tiny_cpu` with the backend's real trainer and check what every backend must
    deliver: a metrics line per step, tokens per step = context length, finite loss, the
    host's packed data (same sha256), figures over the measured steps, the framework's own
    throughput, every host verification passed (framework_bench/measure/verify.py; the throughput
    agreement is timing, so only its presence is asserted) and the settings recorded.
    `shared`: the session's `tiny_cpu_run` fixture, whose run is used in matched mode instead of
    training again. Returns (scenario, result) for backend-specific checks."""
    import math

    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.data.packing import pack
    from framework_bench.worker.files import read_metrics

    if shared is not None and settings_mode == "matched":
        scn, data, result = shared(backend)
    else:
        scn = scenario.load("tiny_cpu")
        data = pack(scn, progress=False, say=lambda msg: None)
        result = pipeline.run_one(backend, scn, RunOptions(root=tmp_path, settings_mode=settings_mode), data=data,
                                  machine=CPU)
    assert result.status == "ok", result.reason
    steps = read_metrics(result.run_dir)
    assert [s["step"] for s in steps] == list(range(1, scn.steps.total + 1))
    assert all(s["tokens"] == scn.context_length for s in steps)
    assert all(math.isfinite(s["loss"]) for s in steps)
    assert result.data_sha256 == data.manifest["sha256"]
    assert result.steps_measured == scn.steps.measured and result.tgs > 0
    assert result.attention_used == "sdpa" and result.framework_version == framework_version
    assert any(k.startswith("tokens_per_sec") and v > 0 for k, v in result.framework_throughput.items())
    checks = {c.name: c for c in result.checks}
    for name in ("tokens", "steps", "rows", "parameters", "settings", "clock", "pauses", "cpu", "initial_weights"):  # the host clock too
        assert checks[name].status == "pass", checks[name]
    assert checks["throughput"].status in ("pass", "fail")  # compared (within 10 % or flagged)
    from framework_bench.measure.verify import REQUIRED_SETTINGS
    assert set(REQUIRED_SETTINGS) <= set(result.settings)
    assert result.settings_mode == result.settings["settings_mode"] == settings_mode
    return scn, result


# The host's checks that stand aside (`unverified`) beside other work: the CPU share and the warm-up's
# and the first window's CPU work. An honest run may end `unverified` by these alone on a busy machine.
LOAD_GUARDED = {"cpu", "warmup", "first_window"}


def passed_but_for_load(result) -> bool:
    """`ok`, or `unverified` where the only blocking checks left unjudged are `LOAD_GUARDED`: never
    failed, nor short of a claim (a `RunResult`)."""
    from framework_bench.measure.verify import BLOCKING
    unjudged = {c.name for c in result.checks if c.status == "unverified" and c.name in BLOCKING}
    return result.status == "ok" or (result.status == "unverified" and bool(unjudged) and unjudged <= LOAD_GUARDED)


def judged_again(result, reference, scenario, monkeypatch, unchecked: str):
    """`result`'s run folder read back and judged against `reference` on `scenario` with the checks
    `unchecked` (comma-separated) left out: `FBENCH_UNCHECKED` is read by the host only, so this is
    what running the lie with those checks off would give."""
    from framework_bench.measure.verify import UNCHECKED_ENV
    from framework_bench.run import pipeline, referee
    from framework_bench.run.launchers import base as launch

    monkeypatch.setenv(UNCHECKED_ENV, unchecked)
    return referee.judge(pipeline.finish(pipeline.Prepared.of_run_dir(result.run_dir, result.backend, None),
                                         launch.Outcome("ok", 0, result.wall_seconds, "")), reference, scenario)


def sequence_parallel_round(s: scenario.Scenario, backend: str, shim: Path, tmp_path: Path, monkeypatch):
    """One round of `s` (SP 2 over two CPU processes) against the torch reference's Ulysses run:
    `backend` as released, then with `shim` (a `sitecustomize`) on its PYTHONPATH, then the
    reference. Both runs' rows, tokens, settings and initial weights passed, each rank fed half of
    every row, SP 2 around SDPA claimed, the model built partitioned (ZeRO-3's zero.Init: rank 0
    holds half of it). Returns (as released, with the shim)."""
    import json
    import os

    from fbench_fixtures import MULTIPROCESS_TIMEOUT
    from framework_bench.run.options import RunOptions
    from framework_bench.run.round import Round
    from framework_bench.worker.files import read_metrics

    round_ = Round(s, RunOptions(root=tmp_path, launcher="torchrun", timeout=MULTIPROCESS_TIMEOUT), reference="torch")
    released = round_.run(backend)
    with monkeypatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shim), os.environ.get("PYTHONPATH")])))
        shimmed = round_.run(backend)
    round_.run("torch")
    round_.close()
    for r in (released, shimmed):
        checks = {c.name: c for c in r.checks}
        assert all(checks[n].status == "pass" for n in ("tokens", "rows", "settings", "initial_weights")), r.checks
        assert all(m["tokens"] == s.context_length // 2 for m in read_metrics(r.run_dir))
        assert (r.settings["sequence_parallel"], r.settings["attention"], r.settings["zero_stage"]) == (2, "sdpa_ulysses", 3)
        # each parameter's partition is its elements / 2, rounded up
        built = json.loads((r.run_dir / "worker.json").read_text())["built"]
        assert built["elements_whole"] / 2 <= built["elements_held"] < built["elements_whole"] * 0.51, built
    return released, shimmed
