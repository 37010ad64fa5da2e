"""The `slurm` launcher: an sbatch script whose one `srun` task per node starts the worker (or,
for several processes, a torchrun over the node's GPUs, the rendezvous host taken from the
allocation), and its submission. Its time limit: `slurm_time`; how the job ended: `slurm_queue`.

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
from framework_bench.run.launchers.slurm_time import SLURM_TIME, TimeEstimate, estimate_time
from framework_bench.run.launchers.torchrun import torchrun_argv
from framework_bench.run.verdicts import Verdict
from framework_bench.spec.scenario import Scenario


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


SBATCH_EXIT_FILE = "slurm-exit-code"  # the job's srun exit status, for clusters without accounting (sacct)


NODE_FILE = "node.txt"  # the batch script's first node: its hostname, then its GPU's name (none on CPU)


WRITTEN_FOR = "# Written by fbench: scenario {scenario}, backend {backend}."

def written_for(script: str) -> tuple[str, str] | None:
    """(scenario, backend) a batch script says it was written for; None where it does not."""
    found = re.search(r"^# Written by fbench: scenario (.+), backend (.+)\.$", script, re.M)
    return (found[1], found[2]) if found else None


def sbatch_script(plan: LaunchPlan, job: Job, time_limit: str = "02:00:00", cpus_per_task: int | None = None,
                  extra: tuple[str, ...] = ()) -> str:
    """A submit-ready sbatch script: one srun task per node, each running torchrun over that
    node's GPUs (a one-process run starts the worker itself); the rendezvous endpoint is the
    allocation's first host. `extra` lines (`--partition=...`) become `#SBATCH` lines.

    Every node must see the run folder, the packed data and the backend env's Python at the
    same paths (a shared filesystem): the job checks that on each node before it starts."""
    if job.nnodes * job.nprocs == 1:
        command = shlex.join([str(plan.python), "-m", plan.module, *plan.args])
    else:
        # Placeholders survive quoting, then become shell expansions the allocation fills in.
        command = shlex.join(torchrun_argv(plan, job, endpoint="@ENDPOINT@", rdzv_id="@JOBID@"))
        command = command.replace("@ENDPOINT@", f'"$head_node:{RDZV_PORT}"').replace("@JOBID@", '"$SLURM_JOB_ID"')
    # The one task per node starts every worker of that node: give it the node's CPUs
    # (srun's default of one CPU per task would pin all workers to one core).
    cpus = str(cpus_per_task) if cpus_per_task else '"$SLURM_CPUS_ON_NODE"'
    srun = f"srun --nodes={job.nnodes} --ntasks-per-node=1"
    shared = [str(job.run_dir), str(job.data_dir), str(plan.python)]
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=fbench-{job.scenario.name}-{job.backend}",
        f"#SBATCH --nodes={job.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        *([f"#SBATCH --gpus-per-node={job.nprocs}"] if job.device == "cuda" else []),
        *([f"#SBATCH --cpus-per-task={cpus_per_task}"] if cpus_per_task else []),
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={job.run_dir}/slurm-%j.out",
        *(f"#SBATCH {arg}" for arg in extra),
        WRITTEN_FOR.format(scenario=job.scenario.name, backend=job.backend),
        "set -euo pipefail",
        f"cd {shlex.quote(str(job.run_dir))}",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())),
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "# What ran the job, for its figures (MFU against this GPU's peak) and its manifest.",
        f"{{ hostname; nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1; }} > {NODE_FILE} || true",
        "set +e  # from here on, every ending leaves its exit status in the run folder",
        "# fbench assumes a filesystem shared by every node: check the paths on each node first.",
        f"{srun} bash -c 'for p in \"$@\"; do [ -e \"$p\" ] || {{ echo \"fbench: $p is missing on $(hostname): "
        "the run folder, the packed data and the backend env must be on a filesystem every node shares, at the "
        "same path\"; exit 3; }; done' fbench-shared-paths " + shlex.join(shared),
        "status=$?",
        f"# One task per node: {'the worker' if job.nnodes * job.nprocs == 1 else f'torchrun starts {job.nprocs} workers there and meets the other nodes at $head_node'}.",
        "if [ $status -eq 0 ]; then",
        "  # The host's clock, beside the workers: stamps their clock lines as they arrive, and reveals the",
        "  # update projection's seed after the last step (framework_bench/measure/clock.py).",
        f"  {shlex.join([str(plan.python), '-m', 'framework_bench.measure.clock', str(job.run_dir), str(job.scenario.steps.warmup), str(job.scenario.steps.total), str(job.scenario.cluster.gpus)] + (['all'] if job.device == 'cuda' else []))} &",
        "  clock_watcher=$!",
        f"  {srun} --cpus-per-task={cpus} --kill-on-bad-exit=1 {command}",
        "  status=$?",
        "  kill -TERM $clock_watcher; wait $clock_watcher",
        "fi",
        f"echo $status > {SBATCH_EXIT_FILE}",
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def write_sbatch(plan: LaunchPlan, job: Job, time_limit: str = "02:00:00", cpus_per_task: int | None = None,
                 extra: tuple[str, ...] = ()) -> Path:
    path = sbatch_path(job)
    path.write_text(sbatch_script(plan, job, time_limit, cpus_per_task, extra))
    return path




class SlurmExecutor(Executor):
    """Writes the batch script and submits it; the run ends on the cluster, and its row is
    stored when its job has ended (`fbench results collect`, or `--wait`)."""

    name = "slurm"

    def refusal(self, verdict: Verdict) -> str | None:
        """Only what no machine can lift: a shortfall of this machine is why SLURM is used."""
        return verdict.reason if verdict.refused_by_backend else None

    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        return ["sbatch", str(sbatch_path(job))]

    def time_limit(self, scenario: Scenario, gpu_name: str | None) -> TimeEstimate:
        return estimate_time(scenario, gpu_name)

    def write(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None) -> dict[str, Path]:
        sbatch: SbatchOptions = options.sbatch
        return {"sbatch": write_sbatch(plan, job, self._limit(options, job.scenario, gpu_name), sbatch.cpus_per_task,
                                       tuple(sbatch.extra))}

    def _limit(self, options: LaunchOptions, scenario: Scenario, gpu_name: str | None) -> str:
        return options.sbatch.time_limit or self.time_limit(scenario, gpu_name).limit

    def start(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None,
              poll: Callable[[], None]) -> Submission:
        """Write the script and submit it where sbatch exists here (recorded in the run folder);
        otherwise, or when sbatch refuses it, a `Submission` without a job id saying why."""
        script = self.write(plan, job, options, gpu_name)["sbatch"]
        warnings = shared_path_warnings(job, plan.python)
        sub = Submission(job_id=None, backend=job.backend, scenario=job.scenario.name, run_dir=job.run_dir,
                         submitted_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                         time_limit=self._limit(options, job.scenario, gpu_name), gpu_name=gpu_name,
                         db=str(options.db) if options.db else None, note="; ".join(warnings) or None)
        if not sbatch_available():
            sub.note = "; ".join([*warnings, f"sbatch not found here: submit {script} on the cluster, "
                                  "then `fbench results collect` stores it when it ends"])
            return sub
        proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
        job_id = proc.stdout.strip().split(";")[0]
        if proc.returncode != 0 or not (job_id.isascii() and job_id.isdigit()):
            sub.note = f"sbatch failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}"
            return sub
        sub.job_id = job_id
        sub.save()
        return sub


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def shared_path_warnings(job: Job, python: Path) -> list[str]:
    """Paths the nodes will not see the same way (node-local locations), seen from here."""
    local = ("/tmp/", "/var/tmp/", "/dev/shm/")
    return [f"{what} {path} looks node-local: every node needs it at the same path" for what, path in
            (("run folder", job.run_dir), ("packed data", job.data_dir), ("env Python", python))
            if str(path).startswith(local)]
