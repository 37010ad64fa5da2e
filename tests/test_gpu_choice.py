"""`--gpu NAME`: "does it fit my GPU?" answered by `fbench show`, the dry runs and `fbench device
estimate`, from the memory estimate and the GPU table (framework_bench/measure/gpus.py); and
`fbench show --scenario`."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from framework_bench.cli import app
from framework_bench.measure import gpus
from framework_bench.measure.memory import estimate, gpu_memory_for
from framework_bench.plugins import registry as plugins
from framework_bench.run.launchers.slurm_time import estimate_time
from framework_bench.scenario import scenario

runner = CliRunner()
SCENARIO = "llama2_7b_32k_1gpu"


def flat(text: str) -> str:
    return " ".join(text.split())  # undo the console's wrapping


def need() -> float:
    """The scenario's per-GPU peak as the estimate has it (the common case: fused AdamW), GiB, as shown."""
    return round(estimate(scenario.load(SCENARIO)).total_gib, 1)


def test_show_says_it_fits_on_an_h200_with_what_is_left():
    res = runner.invoke(app, ["show", SCENARIO, "--gpu", "H200"])
    assert res.exit_code == 0, res.output
    have = gpus.MODELS["H200"].memory_gib
    assert have > need()
    assert (f"memory fits on H200 ({have:g} GiB): ~{need():.1f} GiB per GPU, {have - need():.1f} GiB to spare"
            in flat(res.stdout))
    assert "GPU memory unknown" not in res.stdout


def test_show_says_by_how_much_it_does_not_fit_on_an_a100_40g():
    res = runner.invoke(app, ["show", SCENARIO, "--gpu", "A100-40G"])
    assert res.exit_code == 0, res.output
    have = gpus.MODELS["A100-40G"].memory_gib
    assert f"memory does not fit on A100-40G ({have:g} GiB) by {need() - have:.1f} GiB" in flat(res.stdout)
    assert "fits on" not in res.stdout.replace("does not fit on", "")


def test_show_times_the_steps_on_the_gpu_named():
    s = scenario.load(SCENARIO)  # no published figure: its step time is the GPU's assumed MFU
    h200 = runner.invoke(app, ["show", SCENARIO, "--gpu", "H200"]).stdout
    a100 = runner.invoke(app, ["show", SCENARIO, "--gpu", "A100-80G"]).stdout
    assert f"slurm --time={estimate_time(s, 'H200').limit}:" in flat(h200) and "25% MFU of H200" in h200
    assert f"slurm --time={estimate_time(s, 'A100-80G').limit}:" in flat(a100) and "25% MFU of A100-80G" in a100
    assert estimate_time(s, "H200").step_seconds < estimate_time(s, "A100-80G").step_seconds


@pytest.mark.parametrize("spelling, name", [("h200", "H200"), ("A100-80GB", "A100-80G"), ("a100 80gb", "A100-80G"),
                                            ("NVIDIA L40S", "L40S"), ("b200", "B200"), ("A100_40G", "A100-40G")])
def test_common_spellings_name_one_gpu(spelling, name):
    res = runner.invoke(app, ["show", SCENARIO, "--gpu", spelling])
    assert res.exit_code == 0, res.output
    assert f"fit on {name} ({gpus.MODELS[name].memory_gib:g} GiB)" in flat(res.stdout).replace("fits on", "fit on")


@pytest.mark.parametrize("args", [["show", SCENARIO], ["compare", "--scenario", SCENARIO, "--dry-run"],
                                  ["run", "--backend", "torch", "--scenario", SCENARIO, "--dry-run"],
                                  ["device", "estimate"]])
@pytest.mark.parametrize("unknown", ["V100", "A100"])  # an unqualified A100: which memory is the question
def test_an_unknown_gpu_is_one_error_line_naming_the_known_ones(args, unknown, fbench_home):
    res = runner.invoke(app, [*args, "--gpu", unknown])
    assert res.exit_code == 1 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: --gpu '{unknown}'")
    assert all(name in lines[0] for name in ("H100", "H200", "A100-80G", "A100-40G", "B200", "L40S"))


def test_the_table_holds_the_gpus_asked_for_and_names_them_by_device_name_too():
    assert {"H100", "H200", "A100-80G", "A100-40G", "B200", "L40S"} <= set(gpus.MODELS)
    assert gpu_memory_for("A100-80G") == 80.0 and gpu_memory_for("NVIDIA A100-SXM4-80GB") == 80.0
    assert gpu_memory_for("A100-40G") == 40.0 and gpu_memory_for("NVIDIA B200") == gpus.MODELS["B200"].memory_gib


def test_show_takes_the_scenario_as_an_option_too():
    positional = runner.invoke(app, ["show", SCENARIO])
    option = runner.invoke(app, ["show", "--scenario", SCENARIO])
    assert positional.exit_code == option.exit_code == 0, option.output
    assert option.stdout == positional.stdout
    for args in (["show"], ["show", SCENARIO, "--scenario", SCENARIO]):
        res = runner.invoke(app, args)
        assert res.exit_code == 1 and res.stdout == ""
        assert res.stderr.strip().splitlines() == [
            "error: give the scenario once: `fbench show NAME` or `fbench show --scenario NAME`"]


def test_dry_run_answers_for_each_backend_on_the_gpu_named(home_with_envs):
    from fbench_fixtures import backend_env_or_skip
    backend_env_or_skip("torch")
    s = scenario.load(SCENARIO)
    e = estimate(s, declared=plugins.get("torch").info.memory)
    res = runner.invoke(app, ["compare", "--scenario", SCENARIO, "--backends", "torch", "--dry-run", "--gpu", "a100-40g"])
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert f"{SCENARIO}: 1 node(s) x 1 cuda, judged on A100-40G" in out
    assert f"torch (matched settings): does not fit on A100-40G (40 GiB) by {round(e.total_gib, 1) - 40:.1f} GiB" in out
    # the refusal memory makes, on that GPU (the words "would not fit" are memory's)
    assert f"memory: the {e.peak_phase} would not fit on A100-40G ({e.total_gib:.1f} of 40.0 GiB)" in out
    res = runner.invoke(app, ["compare", "--scenario", SCENARIO, "--backends", "torch", "--dry-run", "--gpu", "H200"])
    out = flat(res.stdout)
    assert f"torch (matched settings): fits on H200 (140.4 GiB): ~{round(e.total_gib, 1):.1f} GiB per GPU" in out
    assert "would not fit" not in out


def test_dry_run_times_the_job_and_the_trials_on_the_gpu_named(fbench_home):
    s = scenario.load(SCENARIO)
    for args in (["compare", "--scenario", SCENARIO, "--backends", "torch"], ["run", "--backend", "torch", "--scenario", SCENARIO]):
        res = runner.invoke(app, [*args, "--dry-run", "--launcher", "slurm", "--repeat", "3", "--gpu", "B200"])
        assert res.exit_code == 0, res.output
        out = flat(res.stdout)
        assert f"#SBATCH --time={estimate_time(s, 'B200').limit}" in out
        assert f"time: --time={estimate_time(s, 'B200').limit}" in out and "25% MFU of B200" in out
        assert "the step time of the model FLOPs at 25% MFU of B200" in out  # the trial cost


def test_gpu_without_a_dry_run_is_refused(fbench_home):
    res = runner.invoke(app, ["run", "--backend", "torch", "--scenario", "tiny_cpu", "--gpu", "H200"])
    assert res.exit_code == 1 and res.stderr.strip().splitlines() == [
        "error: --gpu goes with --dry-run: a run is judged on the GPUs it gets"]


def seconds(text: str) -> dict[tuple[str, str], float]:
    return {(m[1], m[2]): float(m[3]) for m in re.finditer(r"^(\S+)\s+(\S+)\s+([\d.]+) s", text, re.M)}


def test_device_estimate_says_time_as_time_and_memory_as_memory():
    default = runner.invoke(app, ["device", "estimate"])
    assert default.exit_code == 0, default.output
    assert "would not finish within the budget: stored unsupported, check budget" in default.stdout
    assert "would not fit" not in default.stdout and "estimated on one H200:" in default.stdout
    b200 = runner.invoke(app, ["device", "estimate", "--gpu", "b200"]).stdout
    assert "estimated on one B200:" in b200
    h200, b200 = seconds(default.stdout), seconds(b200)
    assert b200[("llama2_7b_32k_1gpu", "torch")] < h200[("llama2_7b_32k_1gpu", "torch")]  # a faster GPU
    assert b200[("tiny_cuda", "torch")] == h200[("tiny_cuda", "torch")]  # start-up alone
    small = runner.invoke(app, ["device", "estimate", "--gpu", "A100-40G"]).stdout
    e = estimate(scenario.load(SCENARIO), declared=plugins.get("torch").info.memory)
    line = next(line for line in small.splitlines() if line.startswith(SCENARIO) and " torch " in line)
    assert f"(refused: memory does not fit on A100-40G (40 GiB) by {round(e.total_gib, 1) - 40:.1f} GiB)" in line
    assert seconds(small)[(SCENARIO, "torch")] == 0.0  # refused at once: no time spent
