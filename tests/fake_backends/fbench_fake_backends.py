"""Throwaway backends for testing the host's handling of runs that end badly.

They are registered through the `fbench.backends` entry-point group (see
`register_through_entry_points`), exactly like a third-party backend. Their worker
(`fbench_fake_worker`) does no training: it exists to end in each way a real worker can
(ok, crash, hang, Ctrl-C), or to tell one lie the host must catch (an echoed sha256, doubled
tokens, missing steps, the wrong rows, the wrong model size), so the tests can check what the
host records; the noisy ones give each trial a step time drawn from a seeded distribution, so
that repeated trials vary as real ones do, the same way on every run of a test.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
from pathlib import Path

from framework_bench.plugins.contract import BackendInfo, Capabilities, EnvSpec, LaunchPlan, WorkerReport, StepMetric
from framework_bench.plugins.hookspecs import hookimpl
from framework_bench.worker.rows import read_consumed
from framework_bench.worker.files import read_metrics, read_worker_report

HERE = Path(__file__).resolve().parent


class FakeBackend:
    """`fault`: a bug of the plugin itself (its worker runs `ok`): an unstartable plan, a report
    hook that removes the run folder or leaves a result.json no disk can take."""

    def __init__(self, name: str, mode: str, fault: str | None = None, info_name: str | None = None):
        self.name, self.mode, self.fault = name, mode, fault
        self.info_name = info_name or name

    @hookimpl
    def fbench_backend_info(self):
        return BackendInfo(
            name=self.info_name, framework="fake", capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
            env=EnvSpec(requirements={"cpu": HERE / "requirements.txt"}, framework_package="pytest"),
        )

    @hookimpl
    def fbench_check(self, scenario, machine, env):
        return None if scenario.cluster.device == "cpu" else "the fake backend runs on CPU only"

    @hookimpl
    def fbench_plan(self, job, env):
        if self.fault == "plan_raises":
            raise ValueError(f"no plan for {job.scenario.name}")
        if self.fault == "plan_writes_job":  # a plan must not touch job.json: the host rewrites it
            job.job_file.write_text("{}")
        # FBENCH_FAKE_PYTHON: another Python to run the worker in (one with torch, for torchrun)
        python = Path(os.environ.get("FBENCH_FAKE_PYTHON", sys.executable))
        args = [str(job.job_file), self.mode]
        extra_env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        if self.fault == "missing_python":
            python = Path("/nonexistent/fbench-fake/bin/python")
        elif self.fault == "nul_env":
            extra_env["FAKE_SETTING"] = "a\0b"
        elif self.fault == "long_argv":
            args.append("x" * (4 << 20))  # beyond the kernel's limit on one argument list
        if self.mode in NOISY:
            # The trial's number among this backend's runs on the scenario in this FBENCH_HOME (each
            # test has its own): the worker's draw is seeded with it, so a test's trials are the same
            # sequence every time, and two backends of one mode draw apart (their names differ).
            trial = len(list(job.run_dir.parent.glob(f"*-{job.scenario.name}-{self.name}-*")))
            args.append(f"{self.name}:{trial}")
        return LaunchPlan(python=python, module="fbench_fake_worker", args=args, env=extra_env)

    @hookimpl
    def fbench_read_report(self, job):
        report = read_worker_report(job.run_dir)
        steps = [StepMetric(**m) for m in read_metrics(job.run_dir)]
        # The fake's "own" figure: its step time (fixed, or the noisy trial's draw), as a framework's log would give it.
        seconds = statistics.median(m.seconds for m in steps) if steps and self.mode in NOISY else 0.5
        own = {"tokens_per_sec_median": job.scenario.context_length / seconds} if steps else {}
        if self.fault == "rm_run_dir":
            shutil.rmtree(job.run_dir)
        elif self.fault == "full_disk":  # result.json lands on a device that is always full (ENOSPC)
            (job.run_dir / "result.json").symlink_to("/dev/full")
        return WorkerReport(steps=steps, data_sha256=report.get("data_sha256"), framework_version="0",
                            framework_throughput=own, settings=report.get("settings"),
                            param_count=report.get("param_count"), consumed_rows=read_consumed(job.run_dir))


ok = FakeBackend("fake_ok", "ok")
crash = FakeBackend("fake_crash", "crash")
hang = FakeBackend("fake_hang", "hang")
interrupt = FakeBackend("fake_interrupt", "interrupt")
stubborn = FakeBackend("fake_stubborn", "stubborn")
LIARS = ("echo_sha", "double_tokens", "missing_steps", "wrong_rows", "wrong_model")
echo_sha = FakeBackend("fake_echo_sha", "echo_sha")
double_tokens = FakeBackend("fake_double_tokens", "double_tokens")
missing_steps = FakeBackend("fake_missing_steps", "missing_steps")
wrong_rows = FakeBackend("fake_wrong_rows", "wrong_rows")
wrong_model = FakeBackend("fake_wrong_model", "wrong_model")

# Workers that write what no real measurement can be (StepMetric bounds them: framework_bench/worker/report.py):
# a garbage line, a step too short to time, no tokens, a NaN loss, numbers beyond SQLite...
BAD_LINES = ("garbage_line", "slow_seconds", "tiny_seconds", "inf_seconds", "zero_tokens", "nan_loss",
             "huge_tokens", "huge_memory", "negative_rank", "extra_steps", "grandchild", "deaf")
PLUGIN_FAULTS = ("missing_python", "nul_env", "long_argv", "rm_run_dir", "full_disk")
for _mode in BAD_LINES:
    globals()[_mode] = FakeBackend(f"fake_{_mode}", _mode)
for _fault in PLUGIN_FAULTS:
    globals()[_fault] = FakeBackend(f"fake_{_fault}", "ok", fault=_fault)

ENTRY_POINTS = {b.name: f"fbench_fake_backends:{attr}" for attr, b in
                [("ok", ok), ("crash", crash), ("hang", hang), ("interrupt", interrupt), ("stubborn", stubborn)]}
ENTRY_POINTS |= {f"fake_{mode}": f"fbench_fake_backends:{mode}" for mode in LIARS + BAD_LINES + PLUGIN_FAULTS}


# Plugins breaking the plan hook's contract (tests/test_pipeline_paths.py, on every launcher).
plan_raises = FakeBackend("fake_plan_raises", "ok", fault="plan_raises")
plan_writes_job = FakeBackend("fake_plan_writes_job", "ok", fault="plan_writes_job")
ENTRY_POINTS |= {"fake_plan_raises": "fbench_fake_backends:plan_raises",
                 "fake_plan_writes_job": "fbench_fake_backends:plan_writes_job"}

slow = FakeBackend("fake_slow", "slow")  # 0.4 s a step: the fault-injection test stops it mid-training
ENTRY_POINTS["fake_slow"] = "fbench_fake_backends:slow"

# Trial-to-trial noise (3% CV, seeded per trial): fake_noisy and fake_noisy_twin are an A/A pair,
# fake_noisy_slow's steps take 25% longer (its TGS 20% lower). NOISY is read by their worker too.
NOISY = ("noisy", "noisy_slow")
noisy = FakeBackend("fake_noisy", "noisy")
noisy_twin = FakeBackend("fake_noisy_twin", "noisy")
noisy_slow = FakeBackend("fake_noisy_slow", "noisy_slow")
ENTRY_POINTS |= {b.name: f"fbench_fake_backends:{attr}" for attr, b in
                 [("noisy", noisy), ("noisy_twin", noisy_twin), ("noisy_slow", noisy_slow)]}
# fake_noisy after an upgrade that slowed its steps by 25% (installed in its place: `fbench diff`).
noisy_upgraded = FakeBackend("fake_noisy", "noisy_slow")

# Two plugins of one distribution answering to one backend name: both broken, none runs.
twin_a = FakeBackend("fake_twin_a", "ok", info_name="fake_twin")
twin_b = FakeBackend("fake_twin_b", "ok", info_name="fake_twin")


def register_through_entry_points(site: Path, entry_points: dict[str, str] | None = None,
                                  distribution: str = "fbench-fake-backends") -> None:
    """Write a dist-info into `site` declaring the fake backends (or `entry_points`, as
    `distribution`); put `site` on sys.path to install."""
    info = site / f"{distribution.replace('-', '_')}-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0\n")
    lines = ["[fbench.backends]"] + [f"{name} = {target}" for name, target in (entry_points or ENTRY_POINTS).items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")



# A plugin whose report claims 5 ms a step on tiny_cpu (the worker of fake_ok; only its claimed
# seconds, and its own throughput to match, are rewritten): 102,400 TGS, 2.2 model TFLOPs, above
# the fp32 peak of a 2-CPU machine (framework_bench/measure/cpu_peak.py); on a machine whose peak
# would allow 5 ms, a third of the shortest step it allows.
class TooFast(FakeBackend):
    @staticmethod
    def claimed_seconds(scenario) -> float:
        from framework_bench.measure import cpu_peak, flops

        peak = cpu_peak.this_machine()
        if isinstance(peak, str):
            return 0.005
        work = scenario.context_length * flops.model_flops_per_token(scenario.arch, scenario.context_length, False)
        shortest = work / (peak.tflops(scenario.precision) * 1e12)
        return 0.005 if 0.005 < shortest else shortest / 3

    @hookimpl
    def fbench_read_report(self, job):
        import dataclasses

        report, seconds = super().fbench_read_report(job), self.claimed_seconds(job.scenario)
        return dataclasses.replace(
            report, steps=[dataclasses.replace(m, seconds=seconds) for m in report.steps],
            framework_throughput={"tokens_per_sec_median": job.scenario.context_length / seconds})


too_fast = TooFast("fake_too_fast", "ok")
ENTRY_POINTS["fake_too_fast"] = "fbench_fake_backends:too_fast"
