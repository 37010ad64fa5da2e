"""The `slurm` launcher: an sbatch script whose one `srun` task per node starts the worker (or,
for several processes, a torchrun over the node's GPUs, the rendezvous host taken from the
allocation); its time limit estimated from the scenario; submission; and the queue, asked how
each submitted job ended.

The estimate: the scenario's steps x the step time its published TGS implies (tokens one
GPU trains per step / TGS), or, without a published figure, the model's FLOPs per token at
an assumed share of the target GPU's peak; times a margin, plus start-up. Printed in every
SLURM plan, overridable with `--time`.

A submitted run is a run folder holding `submit.sbatch` and `slurm.json` (the job id and
what was submitted). `job_state` asks `squeue` (still queued or running) and then `sacct`
(how it ended), falling back to the exit status the batch script writes into the run folder
when the cluster keeps no accounting (a damaged one: the job ended, failed, the note says why).
A job the queue no longer holds, with nothing to tell how it ended, is UNKNOWN and `vanished`;
one that started (wrote `node.txt`) longer ago than its time limit + OVERDUE_MARGIN_S is FAILED.
Its run is stored by `framework_bench/run/collect.py`.

fbench assumes a filesystem every node shares, at the same path, for the run folder, the
packed data and the backend env (FBENCH_HOME and the project checkout): the batch script
checks those paths on every node before it starts the workers.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.measure import flops
from framework_bench.plugins.contract import Job, LaunchPlan
from framework_bench.run.launchers.base import (OOM_MARKERS, RDZV_PORT, Executor, LaunchOptions, Outcome, Submission,
                                                tail)
from framework_bench.run.launchers.torchrun import torchrun_argv
from framework_bench.run.verdicts import Verdict
from framework_bench.spec.scenario import Scenario

# Time-limit estimate. Margins, because a wrong guess costs a whole queue wait: twice the
# expected training time, plus start-up (env import, model build, data conversion, NCCL).
MARGIN = 2.0
STARTUP_S = {"cuda": 30 * 60, "cpu": 10 * 60}
# Without a published TGS: the throughput the model's FLOPs allow at an assumed MFU of the
# target GPU's bf16 peak (a conservative share: the published rows run at 40-50 % MFU on
# A100), or an assumed rate for CPU workers (the tiny CPU models train at several GFLOP/s).
ASSUMED_MFU = 0.25
ASSUMED_CPU_GFLOPS = 10.0
LONG_JOB_S = 2 * 86400  # beyond this many clusters' longest limit: say how to shorten it

SLURM_TIME = re.compile(r"^(\d+-)?\d+(:\d{1,2}){0,2}$|^\d+-\d+$")


class TimeEstimate(BaseModel):
    limit: str = Field(description="the --time value, [D-]HH:MM:SS")
    seconds: int
    step_seconds: float
    steps: int
    unit: str
    startup_seconds: int
    source: str = Field(description="where the step time comes from")
    hint: str | None = None

    def summary(self) -> str:
        return (f"--time={self.limit}: {self.steps} {self.unit} steps x {_duration(self.step_seconds)} "
                f"({self.source}) x {MARGIN:g} margin + {_duration(self.startup_seconds)} start-up"
                + (f"; {self.hint}" if self.hint else ""))


def estimate_time(scenario: Scenario, gpu_name: str | None = None) -> TimeEstimate:
    """The SLURM time limit for `scenario`: its steps x the step time its published TGS
    implies, or else its FLOPs at an assumed MFU of the target GPU; with margin."""
    tokens = scenario.tokens_per_gpu_step
    device = scenario.cluster.device
    if scenario.reference:
        tgs, source = scenario.reference.tgs, f"published TGS {scenario.reference.tgs:g}"
    else:
        per_token = flops.model_flops_per_token(scenario.arch, scenario.context_length,
                                                scenario.activation_checkpointing)
        peak = flops.gpu_peak_tflops(gpu_name) if device == "cuda" else None
        if peak:
            tgs, source = peak * 1e12 * ASSUMED_MFU / per_token, f"model FLOPs at {ASSUMED_MFU:.0%} MFU of {gpu_name}"
        elif device == "cuda":
            peak = min(flops.GPU_PEAK_TFLOPS.values())
            tgs, source = peak * 1e12 * ASSUMED_MFU / per_token, f"model FLOPs at {ASSUMED_MFU:.0%} MFU of {peak:g} TFLOP/s"
        else:
            tgs, source = ASSUMED_CPU_GFLOPS * 1e9 / per_token, f"model FLOPs at an assumed {ASSUMED_CPU_GFLOPS:g} GFLOP/s per CPU process"
    step = tokens / tgs
    steps = scenario.steps.total
    seconds = math.ceil((MARGIN * steps * step + STARTUP_S[device]) / 60) * 60
    hint = None
    if seconds > LONG_JOB_S and scenario.steps.unit == "optimizer" and scenario.grad_accum > 1:
        micro = scenario.model_copy(update={"steps": scenario.steps.model_copy(update={"unit": "micro"})})
        hint = f"with steps.unit micro: {estimate_time(micro, gpu_name).limit}"
    return TimeEstimate(limit=format_time(seconds), seconds=seconds, step_seconds=step, steps=steps,
                        unit=scenario.steps.unit, startup_seconds=STARTUP_S[device], source=source, hint=hint)


def limit_seconds(limit: str) -> int | None:
    """A `--time` value in seconds (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, as sbatch
    reads it); None where it sets no limit or does not read."""
    if not SLURM_TIME.match(limit) or len(limit) > 20:
        return None
    days, _, rest = limit.rpartition("-")
    parts = [int(part) for part in rest.split(":")]
    if days:
        h, m, s = (parts + [0, 0])[:3]
    elif len(parts) == 3:
        h, m, s = parts
    else:
        h, m, s = 0, *(parts + [0])[:2]
    return int(days or 0) * 86400 + h * 3600 + m * 60 + s


def format_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    h, rest = divmod(rest, 3600)
    text = f"{h:02d}:{rest // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.1f} s"


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
# A job is ended by its time limit: one that started (NODE_FILE written) longer ago than that, plus
# this margin (SLURM's grace before the kill, clocks of two machines), is not running any more.
OVERDUE_MARGIN_S = 600


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
        if proc.returncode != 0 or not job_id.isdigit():
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


# ---------------------------------------------------------------------------------------
# The queue

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "STAGE_OUT",
          "SIGNALING", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


class JobState(BaseModel):
    state: str = Field(description="SLURM's state (COMPLETED, FAILED, TIMEOUT...), or UNKNOWN")
    exit_code: int | None = None
    elapsed: float | None = Field(None, description="seconds the job ran (sacct)")
    vanished: bool = Field(False, description=(
        "UNKNOWN, and the queue answered that it no longer holds the job: it ended, how is not recorded"))
    note: str | None = Field(None, description="how fbench came to the state, where SLURM did not say it")

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


def _ask(argv: list[str]) -> subprocess.CompletedProcess | None:
    """The command's answer; None where it could not be asked (not installed here, hung)."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def job_state(sub: Submission) -> JobState:
    """squeue while the job is known to the scheduler, then sacct, then the exit status
    the batch script left in the run folder (clusters without accounting)."""
    queue = _ask(["squeue", "-h", "-j", sub.job_id, "-o", "%T"])
    if queue is not None and queue.returncode == 0 and (queued := queue.stdout.split()):
        return JobState(state=queued[0])
    accounting = _ask(["sacct", "-n", "-P", "-X", "-j", sub.job_id, "-o", "State,ExitCode,ElapsedRaw"])
    for line in (accounting.stdout if accounting is not None and accounting.returncode == 0 else "").splitlines():
        state, code, elapsed = (line.split("|") + ["", ""])[:3]
        if state.strip():
            rc = code.split(":")[0]
            return JobState(state=state.split()[0], exit_code=int(rc) if rc.isdigit() else None,
                            elapsed=float(elapsed) if elapsed.strip().isdigit() else None)
    exit_file = sub.run_dir / SBATCH_EXIT_FILE
    if exit_file.exists():
        return _exit_status(exit_file)
    # No accounting and no exit status: a job killed by SLURM says so in its output.
    text = tail(slurm_output(sub), 50)
    if "DUE TO TIME LIMIT" in text:
        return JobState(state="TIMEOUT")
    if "CANCELLED" in text:
        return JobState(state="CANCELLED")
    if overdue := _overdue(sub):
        return JobState(state="FAILED", note=overdue)
    # Nothing tells how it ended; whether it ended, only the queue can say: one that answers without
    # the job (squeue's "Invalid job id" for a job it has forgotten) no longer holds it.
    gone = queue is not None and (queue.returncode == 0 or "Invalid job id" in queue.stderr)
    return JobState(state="UNKNOWN", vanished=gone)


def _overdue(sub: Submission) -> str | None:
    """Why the job cannot be running any more, where it started longer ago than its time limit
    allows; None otherwise (not started, or no limit to go by)."""
    limit = limit_seconds(sub.time_limit)
    try:
        started = (sub.run_dir / NODE_FILE).stat().st_mtime
    except OSError:
        return None
    if limit is None or time.time() - started <= limit + OVERDUE_MARGIN_S:
        return None
    return (f"started {_duration(time.time() - started)} ago with a time limit of {sub.time_limit}, and nothing "
            f"tells how it ended (not in the queue, no record in sacct, no {SBATCH_EXIT_FILE} in its run folder: "
            f"a node lost): stored failed {OVERDUE_MARGIN_S // 60} min past its limit")


def _exit_status(exit_file: Path) -> JobState:
    """The status the batch script wrote last (`echo $status`): empty, the script was cut off
    while writing it; anything but a number, the file is damaged: either way the job ended, failed."""
    try:
        text = exit_file.read_bytes().decode(errors="replace").strip()
    except OSError as e:
        return JobState(state="FAILED", note=f"ended, but its {exit_file} cannot be read ({e.strerror or e}): "
                                             "how is unknown")
    if not text:
        return JobState(state="FAILED", exit_code=1)
    if not re.fullmatch(r"[0-9]{1,3}", text):
        return JobState(state="FAILED", note=f"ended, but its {exit_file} holds {text[:60]!r}, not an exit "
                                             "status: how is unknown")
    rc = int(text)
    return JobState(state="COMPLETED" if rc == 0 else "FAILED", exit_code=rc)


def slurm_output(sub: Submission) -> Path:
    return sub.run_dir / f"slurm-{sub.job_id}.out"


def outcome_of(sub: Submission, state: JobState) -> Outcome:
    """How the job ended, as the local launchers classify a process."""
    log = slurm_output(sub)
    last = tail(log)
    seconds = state.elapsed if state.elapsed is not None else _output_span(sub)
    if state.state == "COMPLETED" and state.exit_code in (0, None):
        return Outcome("ok", 0, seconds, last)
    note = f"[fbench] SLURM job {sub.job_id} {state.note or f'ended {state.state}'}"
    if state.state == "TIMEOUT":
        return Outcome("timeout", None, seconds, f"{last}\n{note} (time limit {sub.time_limit})")
    oom = state.state == "OUT_OF_MEMORY" or any(m in tail(log, 2000) for m in OOM_MARKERS)
    return Outcome("oom" if oom else "failed", state.exit_code, seconds, f"{last}\n{note}")


def _output_span(sub: Submission) -> float:
    """Without accounting: from the job file's writing to the SLURM output's last write
    (queue time included)."""
    try:
        return max(0.0, slurm_output(sub).stat().st_mtime - (sub.run_dir / "job.json").stat().st_mtime)
    except OSError:
        return 0.0


def node(sub: Submission) -> tuple[str | None, str | None]:
    """(hostname, GPU name) of the node that ran the job, as its batch script wrote them; Nones
    where it wrote nothing (a job that never started, a CPU node has no GPU name)."""
    try:
        lines = (sub.run_dir / NODE_FILE).read_text().splitlines()
    except OSError:
        return None, None
    return (lines[0].strip() or None) if lines else None, (lines[1].strip() or None) if len(lines) > 1 else None


