"""The `slurm` launcher: an sbatch script whose one `srun` task per node is the host's clock
watcher, which starts the worker (or, for several processes, a torchrun over the node's GPUs, the
rendezvous host taken from the allocation) and watches it as the local launcher does, and its
submission. Its time limit: `slurm_time`; how the job ended: `slurm_queue`.

fbench assumes a filesystem every node shares, at the same path, for the run folder, the
packed data and the backend env (FBENCH_HOME and the project checkout): the batch script
checks those paths on every node before it starts the workers.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.plugins.contract import Job, LaunchPlan
from framework_bench.run.launchers.base import RDZV_PORT, Executor, LaunchOptions, Submission
from framework_bench.envs.venvs import bytecode_dir
from framework_bench.run.launchers.local import BYTECODE_PREFIX, NO_BYTECODE
from framework_bench.run.launchers.slurm_time import SLURM_TIME, TimeEstimate, estimate_time
from framework_bench.run.launchers.torchrun import torchrun_argv
from framework_bench.run.refusals import Refusals
from framework_bench.scenario.scenario import Scenario


class SbatchOptions(BaseModel):
    time_limit: str | None = Field(None, description="--time; None: estimated from the scenario")
    cpus_per_task: int | None = Field(None, gt=0, description="None: all of the node's CPUs (the job is exclusive)")
    extra: list[str] = Field(default_factory=list, description="more #SBATCH arguments (partition, account, qos)")


def check_options(options: SbatchOptions) -> str | None:
    """What is wrong with the user's sbatch options, or None."""
    if options.time_limit is not None and not SLURM_TIME.match(options.time_limit):
        return f"--time {options.time_limit!r}: use minutes, HH:MM:SS or D-HH:MM:SS"
    for arg in options.extra:
        if not arg.startswith("-") or "\n" in arg:
            return f"--sbatch-arg {arg!r}: give one sbatch option, e.g. --partition=gpu"
    return None


SBATCH_FILE = "submit.sbatch"


def sbatch_path(job: Job) -> Path:
    return job.run_dir / SBATCH_FILE


SBATCH_EXIT_FILE = "slurm-exit-code"  # the run's srun exit status: how it ended, in a round of several or without sacct
ROUND_OUTPUT = "round-%j.out"  # the job's own output, in its first run's folder; each run's goes to its slurm-JOBID.out


NODE_FILE = "node.txt"  # the batch script's first node: its hostname, then its GPU's name (none on CPU)


WRITTEN_FOR = "# Written by fbench: scenario {scenario}, backend {backend}."

ROUND_LINE = r"^# A round of (\d+) runs on one allocation"  # how a script submitted by hand says it holds several


def written_for(script: str) -> tuple[str, str] | None:
    """(scenario, backend) a batch script says it was written for; None where it does not."""
    found = re.search(r"^# Written by fbench: scenario (.+), backend (.+)\.$", script, re.M)
    return (found[1], found[2]) if found else None


def _run_block(plan: LaunchPlan, job: Job, cpus: str, title: str) -> list[str]:
    """One run of the job, in a subshell of its own (its environment, its folder), all it prints
    in its run folder's `slurm-JOBID.out`: the node's name, the shared paths checked on every
    node, then the workers started by the host's clock watcher, and its exit status."""
    if job.nnodes * job.nprocs == 1:
        command = shlex.join([str(plan.python), "-m", plan.module, *plan.args])
    else:
        # Placeholders survive quoting, then become shell expansions the allocation fills in.
        command = shlex.join(torchrun_argv(plan, job, endpoint="@ENDPOINT@", rdzv_id="@JOBID@"))
        command = command.replace("@ENDPOINT@", f'"$head_node:{RDZV_PORT}"').replace("@JOBID@", '"$SLURM_JOB_ID"')
    srun = f"srun --nodes={job.nnodes} --ntasks-per-node=1"
    shared = [str(job.run_dir), str(job.data_dir), str(plan.python)]
    watcher = [str(plan.python), "-m", "framework_bench.measure.clock", str(job.run_dir), str(job.scenario.steps.warmup),
               str(job.scenario.steps.total), str(job.scenario.cluster.gpus), *_watcher_reads(job), "--"]
    run_dir = shlex.quote(str(job.run_dir))
    return [
        f"# {title}: {job.backend}",
        "(",
        f"  cd {run_dir}",
        *(f"  export {k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())),
        "  # What ran it, for its figures (MFU against this GPU's peak) and its manifest.",
        f"  {{ hostname; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1; }} > {NODE_FILE} || true",
        "  # fbench assumes a filesystem shared by every node: check the paths on each node first.",
        f"  {srun} bash -c 'for p in \"$@\"; do [ -e \"$p\" ] || {{ echo \"fbench: $p is missing on $(hostname): "
        "the run folder, the packed data and the backend env must be on a filesystem every node shares, at the "
        "same path\"; exit 3; }; done' fbench-shared-paths " + shlex.join(shared),
        "  status=$?",
        "  if [ $status -eq 0 ]; then",
        f"    # One task per node: {'the worker' if job.nnodes * job.nprocs == 1 else f'torchrun starts {job.nprocs} workers there and meets the other nodes at $head_node'},",
        "    # started on the first node by the host's clock watcher, so that they are its descendants, as on the",
        "    # local launcher: it stamps their clock lines as they arrive, reads their CPU time on CPU, and reveals the",
        "    # round's projection seed (its standard input) after the last step (framework_bench/measure/clock.py).",
        f"    {srun} --cpus-per-task={cpus} --kill-on-bad-exit=1 {shlex.join(watcher)} {command} <<< \"$seed\"",
        "    status=$?",
        "  fi",
        f"  echo $status > {SBATCH_EXIT_FILE}",
        "  exit $status",
        f') > {run_dir}/"slurm-$SLURM_JOB_ID.out" 2>&1',
    ]


def _watcher_reads(job: Job) -> list[str]:
    """What the watcher reads besides the clock: the workers' CPU time on one CPU node (it is the
    ancestor of that node's workers only), every GPU of the node on CUDA."""
    if job.device == "cuda":
        return ["all"]
    return ["cpu"] if job.nnodes == 1 else []


def sbatch_script(runs: list[tuple[LaunchPlan, Job]], time_limit: str = "02:00:00", cpus_per_task: int | None = None,
                  extra: tuple[str, ...] = (), judging: dict[str, tuple[LaunchPlan, Job]] | None = None,
                  written_for: Job | None = None) -> str:
    """A submit-ready sbatch script running `runs` one after another on one allocation (a SLURM
    round: its last is the reference, whose files no earlier run can read), each as
    `_run_block` says: one srun task per node, torchrun over the node's GPUs (a one-process run
    starts the worker itself), the rendezvous endpoint the allocation's first host. Every run's
    clock watcher reveals one projection seed, drawn here, so each run's update is projected as
    the reference's. Then, for each loss a run of the round trained that the reference's
    differs from (`framework_bench/worker/loss_weighting.py`, asked on the node),
    its `judging` run: the reference trained that way, to judge it at every step. Then, where
    `judging` holds them (`twin_key`), every run's fp32 twin, the reference's last, and the
    reference's twin trained with each twin's loss.
    `extra` lines (`--partition=...`) become `#SBATCH` lines; `written_for`: the run whose
    folder holds this copy (named in its header).

    Every node must see the run folders, the packed data and the backend envs' Python at the
    same paths (a shared filesystem): each run checks that on every node before it starts."""
    judging = judging or {}
    plan, job = runs[0]
    mine = written_for or job
    # The one task per node starts every worker of that node: give it the node's CPUs
    # (srun's default of one CPU per task would pin all workers to one core).
    cpus = str(cpus_per_task) if cpus_per_task else '"$SLURM_CPUS_ON_NODE"'
    name = job.backend if len(runs) == 1 else "round"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=fbench-{job.scenario.name}-{name}",
        f"#SBATCH --nodes={job.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.nprocs}"] if job.device == "cuda" else []),
        *([f"#SBATCH --cpus-per-task={cpus_per_task}"] if cpus_per_task else []),
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={job.run_dir}/{ROUND_OUTPUT}",
        *(f"#SBATCH {arg}" for arg in extra),
        WRITTEN_FOR.format(scenario=mine.scenario.name, backend=mine.backend),
        *([f"# A round of {len(runs)} runs on one allocation, in this order: "
           + ", ".join(j.backend for _, j in runs) + "."] if len(runs) > 1 else []),
        "set -uo pipefail  # no -e: every ending leaves its exit status in its run folder",
        "# Where bytecode is forbidden, workers write it beside the envs instead (launchers/local.py).",
        f"fbench_bytecode={shlex.quote(str(bytecode_dir()))}",
        f'if [ -n "${{{NO_BYTECODE}:-}}" ]; then export {BYTECODE_PREFIX}="${{{BYTECODE_PREFIX}:-$fbench_bytecode}}"; '
        f"unset {NO_BYTECODE}; fi",
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# The round's update-projection seed: never in an argument or the environment, where a worker could read it.",
        f"seed=$({shlex.quote(str(plan.python))} -c 'import secrets; print(secrets.randbits(31))')",
        "worst=0",
    ]
    for i, (run_plan, run_job) in enumerate(runs, 1):
        lines += _run_block(run_plan, run_job, cpus, f"{i}/{len(runs)}")
        lines.append("status=$?; [ $status -eq 0 ] || [ $worst -ne 0 ] || worst=$status")
    lines.append("reference_status=$status")
    schemes = {k: v for k, v in judging.items() if not k.startswith(TWIN_KEY + "/")}
    lines += _judging_lines(runs, schemes, cpus)
    twins = [judging[key] for _, j in runs if (key := twin_key(j.backend)) in judging]
    if twins and twins[-1][1].backend == runs[-1][1].backend:  # the reference's twin judges the others'
        lines += ["# Each run's fp32 twin, the reference's last (framework_bench/run/twin.py): judging runs, never trials.",
                  "if [ $reference_status -eq 0 ]; then"]
        for twin_plan, twin_job in twins:
            lines += ["  " + line for line in _run_block(twin_plan, twin_job, cpus, "fp32 twin")]
        lines += ["  status=$?"]
        reference = runs[-1][1].backend
        twin_schemes = {k.rsplit("/", 1)[1]: v for k, v in judging.items() if k.startswith(twin_key(reference) + "/")}
        lines += ["  " + line for line in _judging_lines(twins, twin_schemes, cpus)]
        lines += ["fi"]
    lines.append("exit $worst")
    return "\n".join(lines) + "\n"


def _judging_lines(runs: list[tuple[LaunchPlan, Job]], judging: dict[str, tuple[LaunchPlan, Job]], cpus: str) -> list[str]:
    """For each loss a run of `runs` trained that the last's (the reference's) differs from (its
    normalisation, its labels rolled: `framework_bench/worker/loss_weighting.py`, asked on the node),
    its `judging` run: the reference trained that way, to judge it at every step; nothing where the
    reference's run failed."""
    if not judging:
        return []
    ref_plan, ref_job = runs[-1]
    ask = [str(ref_plan.python), "-m", "framework_bench.worker.loss_weighting", str(ref_job.run_dir),
           *(str(j.run_dir) for _, j in runs[:-1])]
    lines = ["# The reference trained with each run's loss, where that differs from its own",
             "# (framework_bench/worker/loss_weighting.py): judging runs, never trials.",
             "if [ $status -eq 0 ]; then",
             f"  for scheme in $({shlex.join(ask)}); do",
             '    case "$scheme" in']
    for scheme, (j_plan, j_job) in sorted(judging.items()):
        lines += [f"      {scheme})", *("        " + line for line in _run_block(j_plan, j_job, cpus,
                                                                             f"judging, loss {scheme}")),
                  "        ;;"]
    return lines + ["    esac", "  done", "fi"]


TWIN_KEY = "fp32_twin"


def twin_key(backend: str, loss: str = "") -> str:
    """The key of `backend`'s fp32 twin among a round's judging runs (`Submission.judging`); with
    `loss` (`JudgingLoss.key`), the reference's twin trained with that loss."""
    return "/".join((TWIN_KEY, backend, *([loss] if loss else [])))


def round_runs(runs: int, judging: list[str]) -> int:
    """The most runs a round's job may train: its `runs`, then of its `judging` keys at most one
    reference run a run for the judging losses, every twin, and at most one reference twin a twin."""
    twins = sum(1 for k in judging if k.startswith(TWIN_KEY + "/") and k.count("/") == 1)
    schemes = sum(1 for k in judging if not k.startswith(TWIN_KEY + "/"))
    twin_schemes = sum(1 for k in judging if k.count("/") == 2)
    return runs + min(schemes, runs - 1) + twins + min(twin_schemes, max(twins - 1, 0))


def write_sbatch(runs: list[tuple[LaunchPlan, Job]], time_limit: str = "02:00:00", cpus_per_task: int | None = None,
                 extra: tuple[str, ...] = (), judging: dict[str, tuple[LaunchPlan, Job]] | None = None) -> Path:
    """The round's script in each of its runs' folders (each copy naming its run); the first's is submitted."""
    for _, job in runs:
        sbatch_path(job).write_text(sbatch_script(runs, time_limit, cpus_per_task, extra, judging, written_for=job))
    return sbatch_path(runs[0][1])




class SlurmExecutor(Executor):
    """Writes the batch script and submits it; the run ends on the cluster, and its row is
    stored when its job has ended (`fbench results collect`, or `--wait`)."""

    name = "slurm"

    def refusal(self, refusals: Refusals) -> str | None:
        """Only what no machine can lift: a shortfall of this machine is why SLURM is used."""
        return refusals.reason if refusals.refused_by_backend else None

    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        return ["sbatch", str(sbatch_path(job))]

    def time_limit(self, scenario: Scenario, gpu_name: str | None, runs: int = 1) -> TimeEstimate:
        return estimate_time(scenario, gpu_name, runs)

    def write(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None) -> dict[str, Path]:
        sbatch: SbatchOptions = options.sbatch
        return {"sbatch": write_sbatch([(plan, job)], self._limit(options, job.scenario, gpu_name), sbatch.cpus_per_task,
                                       tuple(sbatch.extra))}

    def _limit(self, options: LaunchOptions, scenario: Scenario, gpu_name: str | None, runs: int = 1) -> str:
        return options.sbatch.time_limit or self.time_limit(scenario, gpu_name, runs).limit

    def start(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None,
              poll: Callable[[], None]) -> Submission:
        """Write the script and submit it where sbatch exists here (recorded in the run folder);
        otherwise, or when sbatch refuses it, a `Submission` without a job id saying why."""
        return self.submit_round([(plan, job)], {}, options, gpu_name)[0]

    def submit_round(self, runs: list[tuple[LaunchPlan, Job]], judging: dict[str, tuple[LaunchPlan, Job]],
                     options: LaunchOptions, gpu_name: str | None) -> list[Submission]:
        """One job for the round's runs, one after another (`sbatch_script`): its script written into
        each run's folder and submitted once where sbatch exists here. A `Submission` per run, all of
        one job id (each recorded in its run folder), or, where sbatch is missing or refuses, none
        saying why. Its time limit covers every run and the judging runs it may add."""
        sbatch: SbatchOptions = options.sbatch
        scenario = runs[0][1].scenario
        limit = self._limit(options, scenario, gpu_name, round_runs(len(runs), list(judging)))
        script = write_sbatch(runs, limit, sbatch.cpus_per_task, tuple(sbatch.extra), judging)
        warnings = list(dict.fromkeys(w for plan, job in [*runs, *judging.values()]
                                      for w in shared_path_warnings(job, plan.python)))
        subs = [Submission(job_id=None, backend=job.backend, scenario=scenario.name, run_dir=job.run_dir,
                           submitted_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"), time_limit=limit, gpu_name=gpu_name,
                           db=str(options.db) if options.db else None, note="; ".join(warnings) or None,
                           round_runs=len(runs)) for _, job in runs]
        if not sbatch_available():
            note = "; ".join([*warnings, f"sbatch not found here: submit {script} on the cluster, "
                              "then `fbench results collect` stores it when it ends"])
        else:
            proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
            job_id = proc.stdout.strip().split(";")[0]
            if proc.returncode == 0 and job_id.isascii() and job_id.isdigit():
                for sub in subs:
                    sub.job_id = job_id
                    sub.save()
                return subs
            note = f"sbatch failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
        for sub in subs:
            sub.note = note
        return subs


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def shared_path_warnings(job: Job, python: Path) -> list[str]:
    """Paths the nodes will not see the same way (node-local locations), seen from here."""
    local = ("/tmp/", "/var/tmp/", "/dev/shm/")
    return [f"{what} {path} looks node-local: every node needs it at the same path" for what, path in
            (("run folder", job.run_dir), ("packed data", job.data_dir), ("env Python", python))
            if str(path).startswith(local)]
