"""Every reason a run would be refused, side by side: this machine, the backend env, the
backend's own check on the scenario's nodes, and the memory estimate.

`this machine` is where fbench runs (often a login node without GPUs). A backend's own
check is asked about the scenario's *target* nodes (the GPUs the scenario names), so a
shortfall here never hides what the backend itself would refuse there (e.g. "needs 4 x 8
GPUs" and "xtuner: sequence parallel 16 needs flash_attn", both).
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from framework_bench.envs import venvs as envs
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import BackendEnv, Machine, MemoryScheme
from framework_bench.measure.memory import MemoryEstimate, estimate, gpu_memory_for
from framework_bench.scenario.families import transformers_refusal
from framework_bench.scenario.scenario import Scenario


class Refusals(BaseModel):
    backend: str
    machine: str | None = Field(None, description="why this machine cannot host the scenario's processes")
    env: str | None = Field(None, description="the backend env here vs what the scenario's nodes need")
    check: str | None = Field(None, description="the backend's own check, on the scenario's nodes")
    memory: str | None = Field(None, description="the per-GPU memory estimate on the scenario's nodes (CPU: all "
                                                 "processes' in this machine's memory)")
    # Computed once here, for the backend's declared memory scheme in the run's settings mode, and
    # read by every line that shows it (refusals, plans); not part of the plan's JSON.
    estimate: MemoryEstimate | None = Field(None, exclude=True, description="the per-GPU memory estimate (CUDA)")

    @property
    def refused_by_backend(self) -> bool:
        """A refusal no machine can lift: the backend, its env, or memory says no. With a
        shortfall of this machine only, the run can still be submitted to the scenario's nodes."""
        return any((self.env, self.check, self.memory))

    @property
    def reason(self) -> str | None:
        """Every refusal in one line (None when the run can go ahead on this machine)."""
        parts = [self.machine, self.env and f"{self.backend} env: {self.env}",
                 self.check and f"{self.backend}: {self.check}", self.memory and f"memory: {self.memory}"]
        return "; ".join(p for p in parts if p) or None


def fit_refusal(e: MemoryEstimate, gpu_name: str | None) -> str:
    """Why an estimate refuses: the phase that does not fit first, then every term."""
    return (f"the {e.peak_phase} would not fit on {gpu_name or 'this GPU'} ({e.total_gib:.1f} of "
            f"{e.gpu_memory_gib:.1f} GiB): {e.summary()}; --force runs it anyway")


def memory_gib() -> float | None:
    """This machine's memory (`MemTotal` in /proc/meminfo), GiB; None where it cannot be read."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None


def ram_refusal(scenario: Scenario, declared: MemoryScheme | None, settings_mode: str) -> str | None:
    """Why a CPU scenario's processes, all on this machine, would not fit in its memory by the
    memory estimate less its overhead term (CUDA's context and allocator slack, NCCL: none on a
    CPU, and most of a tiny model's estimate); None when they fit or the memory is unknown."""
    have = memory_gib()
    if have is None:
        return None
    e = estimate(scenario, declared=declared, settings_mode=settings_mode)
    each = e.total_gib - e.overhead_gib
    n = scenario.cluster.gpus
    if n * each <= have:
        return None
    return (f"{n} process(es) x ~{each:,.1f} GiB at the {e.peak_phase} (params {e.parameters_gib:,.1f} + grads "
            f"{e.gradients_gib:,.1f} + optim {e.optimizer_states_gib:,.1f}, activations {e.activations_gib:,.1f} GiB: "
            f"the memory estimate less its {e.overhead_gib:.1f} GiB of CUDA overhead) would not fit in this machine's "
            f"{have:.1f} GiB of memory; --force runs it anyway")


def machine_shortfall(scenario: Scenario, machine: Machine, need: MemoryEstimate | None = None) -> str | None:
    """Why this machine cannot host the scenario's processes (any backend), or None; `need`, a
    backend's memory estimate, is named with it."""
    c = scenario.cluster
    if c.device == "cuda" and (c.nodes > 1 or machine.gpus < c.gpus_per_node):
        have = f"{machine.gpus} x {machine.gpu_name} ({machine.gpu_memory_gib} GiB)" if machine.gpus else "no GPU"
        each = f", ~{need.total_gib:.1f} GiB each by the memory estimate" if need else ""
        return (f"needs {c.nodes} node(s) x {c.gpus_per_node} GPUs ({c.gpus} in all{each}); this machine has "
                f"{have}: see the plans with --dry-run, or write and submit them with --launcher slurm")
    if c.device == "cpu" and c.gpus > (machine.cpu_count or 1):
        return (f"needs {c.gpus} worker processes ({c.nodes} node(s) x {c.gpus_per_node}), all on this machine, "
                f"which has {machine.cpu_count} CPU cores")
    return None


def target_machine(scenario: Scenario, machine: Machine) -> Machine:
    """The node the scenario runs on: this machine when it can host it, else one node of the
    scenario's cluster with the GPUs of its published reference (the hardware it names)."""
    if machine_shortfall(scenario, machine) is None:
        return machine
    name = scenario.reference.hardware if scenario.reference else machine.gpu_name
    return Machine(gpus=scenario.cluster.gpus_per_node, gpu_name=name, gpu_memory_gib=gpu_memory_for(name),
                   cpu=machine.cpu, cpu_count=machine.cpu_count)


def env_for_target(scenario: Scenario, env: BackendEnv) -> tuple[BackendEnv, str | None]:
    """The env as the scenario's nodes would run it (the same path, on a shared filesystem),
    and what must change first. A CPU-flavour env here is judged as if it were the cuda
    flavour, so the backend's check still names what else is missing (flash-attn...)."""
    if env.ready and scenario.cluster.device == "cuda" and env.flavour != "cuda":
        note = (f"the {env.name} env here is the {env.flavour} flavour; the nodes run the env at this same path, "
                f"so recreate it with `fbench env create {env.name} --flavour cuda`")
        return env.model_copy(update={"flavour": "cuda"}), note
    return env, None


def refusals_for(backend: plugins.RegisteredBackend, scenario: Scenario, machine: Machine, env: BackendEnv | None = None,
          force: bool = False, settings_mode: str = "matched") -> tuple[BackendEnv, Refusals]:
    """(env, refusals) for `backend` running `scenario`, seen from `machine`."""
    env = env or envs.inspect(backend.name, backend.info.env)
    target = target_machine(scenario, machine)
    e = (estimate(scenario, declared=backend.info.memory, settings_mode=settings_mode,
                  gpu_memory_gib=target.gpu_memory_gib) if scenario.cluster.device == "cuda" else None)
    shortfall = machine_shortfall(scenario, machine, e)
    judged_env, env_note = env_for_target(scenario, env) if shortfall else (env, None)
    check = (backend.refusal(scenario)
             or transformers_refusal(scenario.arch.architecture, judged_env.version("transformers"))
             or backend.check(scenario, target, judged_env))
    memory = None
    if not force and check is None and e is not None and e.fits is False:
        memory = fit_refusal(e, target.gpu_name)
    elif not force and check is None and scenario.cluster.device == "cpu":
        memory = ram_refusal(scenario, backend.info.memory, settings_mode)
    return env, Refusals(backend=backend.name, machine=shortfall, env=env_note, check=check, memory=memory, estimate=e)
