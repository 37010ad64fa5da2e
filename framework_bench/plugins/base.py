"""`Backend`: the base class a backend plugin subclasses, with the glue every backend shares.

A backend writes only what is its own: `info()`, its own refusals (`check`, calling
`super().check` for the common ones), its framework's config files (`write_files`) and its
framework's own throughput figure (`framework_throughput`). The base supplies the four hooks
of `framework_bench/plugins/hookspecs.py` on top of those: the env / GPU / flavour checks
with one wording, the plan with the standard worker environment, and `read_report` from the
files the worker SDK writes (`framework_bench/worker/files.py`). Registration: name the class
in the `fbench.backends` entry point (`mybackend = "fbench_mybackend.plugin:MyBackend"`); the
registry makes one instance of it and registers that with pluggy like any other plugin.

A plugin of module-level hooks (the first contract's form) keeps working unchanged beside it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import ClassVar

from framework_bench.plugins import deepspeed_jit, plan_env
from framework_bench.plugins.contract import BackendEnv, BackendInfo, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.plugins.hookspecs import hookimpl
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.files import read_metrics, read_worker_report
from framework_bench.worker.report import Claims
from framework_bench.worker.rows import read_consumed
from framework_bench.worker.startup import startup_note

# Worker output reaches the run's log as it is written (a crash keeps its last lines), and
# HF tokenizers do not fork a thread pool per process.
OUTPUT_ENV = {"PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
# The contract of a subclass whose `info()` declares none: the base class then stood for
# contract 2, so a subclass written for it keeps being judged by it (claims added later
# leave its runs `unverified`, never `invalid`).
SUBCLASS_CONTRACT = 2


class Backend:
    """A backend plugin. Subclass it, implement `info`, and override what your framework needs."""

    # The plan's standard environment (`run_env`), as each bundled backend has always set it.
    output_env: ClassVar[bool] = True  # OUTPUT_ENV
    pin_gpus: ClassVar[bool] = True  # CUDA_VISIBLE_DEVICES: the job's GPUs only (plan_env.visible_gpus_env)

    # --- what a backend writes -------------------------------------------------------------

    def info(self) -> BackendInfo:
        """Name, framework, capabilities and env spec (see `fbench_backend_info`). Set `contract`
        to the number of the plugin contract you wrote against (`contract=4`): a subclass that leaves
        it unset is of contract `SUBCLASS_CONTRACT`, the one in force before contracts moved on
        without it, and one naming the host's `CONTRACT` of `contract.CONTRACT_NAMED_FROM`."""
        raise NotImplementedError(f"{type(self).__name__} does not implement info()")

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        """Why this backend cannot run `scenario` here, or None. Override it for your own
        refusals and call this one for the env and the GPUs."""
        name = env.name
        if not env.ready:
            return f"the {name} env is not ready: {env.problem}"
        if scenario.cluster.device != "cuda":
            return None
        if not machine.gpus:
            return "the scenario runs on CUDA GPUs; this machine has none"
        if scenario.cluster.gpus_per_node > machine.gpus:
            return f"the scenario needs {scenario.cluster.gpus_per_node} GPUs per node; this machine has {machine.gpus}"
        if env.flavour != "cuda":
            return f"the {name} env is the CPU flavour (CPU torch build): recreate it with --flavour cuda"
        return None

    def write_files(self, job: Job, env: BackendEnv) -> dict[str, Path]:
        """Write the framework's config files into `job.run_dir`; return them by role."""
        return {}

    def uses_deepspeed(self, job: Job) -> bool:
        """Whether this job runs on DeepSpeed: its plan then gets a process group (below)."""
        return False

    def needs_process_group(self, job: Job) -> bool:
        """Whether one process started without torchrun gets the variables of a world of one:
        both frameworks need a process group on a GPU and under DeepSpeed."""
        return job.device == "cuda" or self.uses_deepspeed(job)

    def framework_throughput(self, job: Job, worker: dict) -> dict[str, float]:
        """The framework's own throughput figure (keys: see `fbench_read_report`); by default
        the `throughput` the worker put in its report."""
        return worker.get("throughput", {})

    # --- what the base supplies -------------------------------------------------------------

    @property
    def package(self) -> str:
        return type(self).__module__.split(".")[0]

    @property
    def worker_module(self) -> str:
        """The module the plan runs with the env's Python: `<package>.worker`."""
        return f"{self.package}.worker"

    def run_env(self, job: Job, env: BackendEnv) -> dict[str, str]:
        """The worker's environment: output settings, the job's GPUs, the CUDA allocator
        (plan_env.cuda_allocator_env), DeepSpeed's prebuilt ops for a backend whose env builds them
        (`deepspeed_jit` among its post-install steps), and a process group where `needs_process_group`."""
        run_env = {**(OUTPUT_ENV if self.output_env else {}), **(plan_env.visible_gpus_env(job) if self.pin_gpus else {}),
                   **plan_env.cuda_allocator_env(job)}
        if deepspeed_jit.__name__ in self.info().env.post_install:
            run_env |= deepspeed_jit.run_env(env.path)
        if self.needs_process_group(job):
            run_env |= plan_env.process_group_env(job)
        return run_env

    def plan(self, job: Job, env: BackendEnv) -> LaunchPlan:
        files = self.write_files(job, env)
        return LaunchPlan(python=env.python, module=self.worker_module, args=[str(job.job_file)],
                          env=self.run_env(job, env), files={**files, "job": job.job_file})

    def read_report(self, job: Job) -> WorkerReport:
        """Everything the worker SDK wrote: metrics, worker.json's claims, consumed rows, and
        the start-up breakdown as a note."""
        records, worker = read_metrics(job.run_dir), read_worker_report(job.run_dir)
        if not records and not worker:
            raise FileNotFoundError(f"the {job.backend} worker wrote no metrics and no report in {job.run_dir}")
        # A claim worker.json leaves out, or writes as null (an older SDK's empty notes), takes its default.
        claims = {f.name: worker[f.name] for f in dataclasses.fields(Claims) if worker.get(f.name) is not None}
        claims["notes"] = list(claims.get("notes", [])) + startup_note(worker.get("startup_seconds"),
                                                                       worker.get("startup_breakdown"))
        return WorkerReport.model_validate({
            **claims, "steps": records, "data_sha256": worker.get("data_sha256"),
            "framework_throughput": self.framework_throughput(job, worker), "consumed_rows": read_consumed(job.run_dir)})

    # --- the hooks (framework_bench/plugins/hookspecs.py), on the methods above -------------

    @hookimpl
    def fbench_backend_info(self) -> BackendInfo:
        info = self.info()
        return info if "contract" in info.model_fields_set else info.model_copy(update={"contract": SUBCLASS_CONTRACT})

    @hookimpl
    def fbench_check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        return self.check(scenario, machine, env)

    @hookimpl
    def fbench_plan(self, job: Job, env: BackendEnv) -> LaunchPlan:
        return self.plan(job, env)

    @hookimpl
    def fbench_read_report(self, job: Job) -> WorkerReport:
        return self.read_report(job)
