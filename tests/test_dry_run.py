"""--dry-run: every published scenario gets a complete plan from both backends, without
packing or launching anything, on a machine that has none of the GPUs they need."""

import pytest
from typer.testing import CliRunner

from framework_bench.run.dry_run import dry_run
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.plugins.contract import Machine
from framework_bench.cli import app

PUBLISHED = [s.name for s in scenario.load_all() if s.reference]
NO_GPU = Machine(gpus=0, cpu_count=2)


@pytest.mark.parametrize("backend", ["xtuner", "llamafactory"])
@pytest.mark.parametrize("name", PUBLISHED)
def test_dry_run_plans_every_published_scenario(name, backend, fbench_home):
    s = scenario.load(name)
    d = dry_run(backend, s, RunOptions(launcher="slurm"), NO_GPU)
    assert d.check and f"{s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} GPUs" in d.check
    # the backend's own verdict on the scenario's nodes stands beside this machine's shortfall
    v = d.refusals
    assert v.machine and v.machine in d.check
    if v.check:
        assert f"{backend}: {v.check}" in d.check
    assert d.time is not None and d.time.steps == s.steps.total
    sbatch = d.files["sbatch"].read_text()
    assert f"#SBATCH --time={d.time.limit}" in sbatch
    assert f"#SBATCH --nodes={s.cluster.nodes}" in sbatch and f"--nproc-per-node {s.cluster.gpus_per_node}" in sbatch
    assert f"fbench_{backend}.worker" in sbatch
    assert all(p.exists() for p in d.files.values())
    assert not any(fbench_home.glob("data/*/input_ids.npy"))  # nothing was packed


def test_cli_dry_run_slurm_for_yi34b_128k(fbench_home):
    # the two named: another installed backend (torch refuses ZeRO 3, a third-party one) prints its own
    res = CliRunner().invoke(app, ["compare", "--scenario", "yi34b_128k", "--backends", "xtuner,llamafactory",
                                   "--dry-run", "--launcher", "slurm"])
    assert res.exit_code == 0, res.output
    out = res.stdout
    for backend in ("xtuner", "llamafactory"):
        assert f"{backend} via slurm" in out
    assert out.count("#SBATCH --nodes=4") == 2 and "fits in 80.0 GiB" in out
    assert "sequence_parallel_size" in out  # the generated XTuner config's key contents are shown


def test_without_dry_run_it_says_what_is_missing(fbench_home, tmp_path):
    res = CliRunner().invoke(app, ["run", "--backend", "xtuner", "--scenario", "yi34b_128k"])
    assert res.exit_code == 0 and "unsupported" in res.stdout
    assert "needs 4 node(s) x 8 GPUs" in res.stdout and "--launcher slurm" in res.stdout
    assert "Traceback" not in res.output



def test_cli_dry_run_shows_every_verdict_for_llama2_70b_256k(home_with_envs):
    """Beside the GPU shortfall: XTuner's flash-attn requirement, LLaMA-Factory's verdict on SP 16 with 8 KV heads."""
    from fbench_fixtures import backend_env_or_skip
    for name in ("xtuner", "llamafactory"):
        backend_env_or_skip(name)
    res = CliRunner().invoke(app, ["compare", "--scenario", "llama2_70b_256k", "--backends", "xtuner,llamafactory",
                                   "--dry-run"])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())  # undo the console's wrapping
    assert out.count("this machine: needs 4 node(s) x 8 GPUs") == 2
    assert "xtuner: sequence_parallel 16 needs flash_attn" in out
    assert "llamafactory: sequence_parallel 16 with 8 KV heads" in out
    assert "cp_size must divide num_key_value_heads (8)" in out
    assert out.count(": refused") == 2


@pytest.mark.parametrize("settings", ["native", "matched"])
def test_every_memory_figure_of_a_backend_is_its_plan_lines(settings, home_with_envs, monkeypatch):
    """The scenario's header, the verdict's "~N GiB each" and the plan line give one figure per
    backend. Before, the header and the verdict gave the estimate for no backend in matched mode:
    ~105 GiB above XTuner's own 127.5 GiB plan line (native mode) on llama2_7b_8k_1gpu."""
    import re

    from fbench_fixtures import backend_env_or_skip
    for name in ("xtuner", "torch"):
        backend_env_or_skip(name)
    monkeypatch.setattr("framework_bench.measure.machine.detect", lambda: NO_GPU)
    res = CliRunner().invoke(app, ["compare", "--scenario", "llama2_7b_8k_1gpu", "--backends", "xtuner,torch",
                                   "--dry-run", "--settings", settings])
    assert res.exit_code == 0, res.output
    out = " ".join(res.stdout.split())  # undo the console's wrapping
    header = {backend: gib for names, gib in re.findall(rf"(\w+(?:, \w+)*) \({settings} settings\): ~([\d.]+) GiB per GPU", out)
              for backend in names.split(", ")}
    printed = {}  # each backend's block: its verdict's figures, its plan line's
    for block in re.split(r"(?=\b(?:xtuner|torch) via local: )", out)[1:]:
        printed[block.split()[0]] = (re.findall(r"~([\d.]+) GiB each by the memory estimate", block),
                                     re.findall(r"memory: ~([\d.]+) GiB at the", block))
    assert sorted(header) == sorted(printed) == ["torch", "xtuner"], out
    for backend, (verdict, plan) in printed.items():
        assert len(plan) == 1 and verdict == plan == [header[backend]], (backend, out)
    if settings == "native":  # XTuner's foreach AdamW with its fp32 copy: not the reference's figure
        assert header["xtuner"] != header["torch"]


def test_a_published_row_outside_a_bundled_backends_capabilities_is_refused_naming_what_it_lacks():
    """Every published row a bundled backend does not declare it can run is refused with what it
    lacks there (the framework's engine not bound, a kernel), never the bare 'declares no ...'."""
    from framework_bench.plugins import registry

    for name in PUBLISHED:
        s = scenario.load(name)
        for backend in ("torch", "xtuner", "llamafactory", "trl", "swift"):
            capabilities = registry.get(backend).info.capabilities
            reason = capabilities.refusal(s, backend)
            if reason is not None:
                assert any(f"({why})" in reason for why in capabilities.missing.values()), (name, backend, reason)
    # trl declares sequence parallel, and its own env (accelerate 1.11) refuses the SP rows naming
    # the layer that runs them
    from backend_helpers import H100x8, ready_env

    env = ready_env("trl", {"trl": "1.16.0", "accelerate": "1.11.0"}, "cuda", "deepspeed")
    split = [s for s in map(scenario.load, PUBLISHED) if s.sequence_parallel > 1]
    reasons = [registry.get("trl").check(s, H100x8, env) for s in split]
    assert split and all("`--backends trl@accelerate==1.12.0@deepspeed==0.18.6`" in r for r in reasons), reasons
