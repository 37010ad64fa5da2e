"""Helpers the backend plugin tests share: machines, a ready env, tiny scenarios, jobs."""

from __future__ import annotations

from pathlib import Path

from framework_bench import scenario
from framework_bench.backend import BackendEnv, Job, Machine

CPU = Machine(gpus=0, cpu_count=2)
H100x8 = Machine(gpus=8, gpu_name="NVIDIA H100 80GB HBM3", gpu_memory_gib=80)


def ready_env(name: str, versions: dict[str, str], flavour: str, *extra: str) -> BackendEnv:
    """An env as `envs.inspect` reports a finished one, with the distributions named installed."""
    return BackendEnv(name=name, path=Path("/nonexistent"), python=Path("/nonexistent/bin/python"),
                      flavour=flavour, ready=True, versions={"torch": "2.13.0", **versions, **{d: "1" for d in extra}})


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
