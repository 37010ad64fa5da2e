"""Launchers: turn a backend's plan into a process tree, watch it, and classify how it ended.

`local` runs the worker module as one process; `torchrun` wraps it in
`python -m torch.distributed.run` from the backend's own env (the host has no torch);
`slurm` writes an sbatch script whose one `srun` task per node starts that torchrun, with
the rendezvous host taken from the allocation.
"""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from framework_bench.run import interrupts
from framework_bench.plugins.backend import Job, LaunchPlan

Launcher = Literal["local", "torchrun", "slurm"]
RDZV_PORT = 29500
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "Cannot allocate memory")


def torchrun_argv(plan: LaunchPlan, job: Job, endpoint: str = f"127.0.0.1:{RDZV_PORT}",
                  node_rank: int | None = None, rdzv_id: str | None = None) -> list[str]:
    argv = [str(plan.python), "-m", "torch.distributed.run",
            "--nnodes", str(job.nnodes), "--nproc-per-node", str(job.nprocs),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if node_rank is not None:
        argv += ["--node-rank", str(node_rank)]
    if rdzv_id is not None:
        argv += ["--rdzv-id", rdzv_id]
    return argv + ["-m", plan.module, *plan.args]


def process_group_env(job: Job) -> dict[str, str]:
    """The variables torchrun would set, for a run started as one process without it.

    Both frameworks need an initialised process group on a GPU or with DeepSpeed even for
    one process (DeepSpeed otherwise falls back to MPI discovery; XTuner's dispatched
    attention calls `dist.get_rank()`): a one-process job is a world of one on a free port.
    Several processes get these from torchrun, so nothing is returned for them."""
    if job.nprocs * job.nnodes > 1:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def visible_gpus_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`CUDA_VISIBLE_DEVICES` naming the job's GPUs per node: the first `nprocs` of those
    already visible (the user's or the scheduler's choice), else 0..nprocs-1. Without it a
    one-process job on an 8-GPU host sees 8 GPUs (LLaMA-Factory's HF Trainer then raises)."""
    if job.device != "cuda":
        return {}
    environ = os.environ if environ is None else environ
    visible = [d.strip() for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    chosen = visible[:job.nprocs] if len(visible) >= job.nprocs else [str(i) for i in range(job.nprocs)]
    return {"CUDA_VISIBLE_DEVICES": ",".join(chosen)}


CUDA_ALLOC_CONF = "expandable_segments:True"


def cuda_allocator_env(job: Job, environ: dict[str, str] | None = None) -> dict[str, str]:
    """`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` for every CUDA plan, both settings
    modes, unless the user set the variable (theirs then reaches the worker unchanged).
    Expandable segments grow one mapping instead of caching fixed blocks, so a step whose
    tensor sizes change between phases (activations, then the optimizer's temporaries)
    leaves little reserved-but-unusable memory: the same allocator for every backend. The
    workers record the value in effect (`cuda_alloc_conf` in their settings)."""
    environ = os.environ if environ is None else environ
    if job.device != "cuda" or "PYTORCH_CUDA_ALLOC_CONF" in environ:
        return {}
    return {"PYTORCH_CUDA_ALLOC_CONF": CUDA_ALLOC_CONF}


def default_launcher(job: Job) -> Launcher:
    return "torchrun" if job.nprocs * job.nnodes > 1 else "local"


def argv_for(plan: LaunchPlan, job: Job, launcher: Launcher) -> list[str]:
    """The one command that starts the run (for several nodes without slurm: see `node_argvs`)."""
    if launcher == "local":
        if job.nprocs * job.nnodes > 1:
            raise ValueError(f"{job.nprocs * job.nnodes} processes need --launcher torchrun")
        return [str(plan.python), "-m", plan.module, *plan.args]
    if launcher == "slurm":
        return ["sbatch", str(sbatch_path(job))]
    return torchrun_argv(plan, job)


def node_argvs(plan: LaunchPlan, job: Job, launcher: Launcher) -> list[list[str]]:
    """The commands this machine starts: one per node, all meeting on a free loopback port.
    Several nodes from one machine only test the multi-node rendezvous; clusters use `slurm`."""
    if launcher != "torchrun":
        return [argv_for(plan, job, launcher)]
    endpoint = f"127.0.0.1:{free_port()}"
    ranks = range(job.nnodes) if job.nnodes > 1 else [None]
    return [torchrun_argv(plan, job, endpoint=endpoint, node_rank=n) for n in ranks]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SBATCH_FILE = "submit.sbatch"


def sbatch_path(job: Job) -> Path:
    return job.run_dir / SBATCH_FILE


SBATCH_EXIT_FILE = "slurm-exit-code"  # the job's srun exit status, for clusters without accounting (sacct)


NODE_FILE = "node.txt"  # the batch script's first node: its hostname, then its GPU's name (none on CPU)


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
        f"# Written by fbench: scenario {job.scenario.name}, backend {job.backend}.",
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
        "  # The host's clock, beside the workers: stamps their clock lines as they arrive (framework_bench/measure/clock.py).",
        f"  {shlex.join([str(plan.python), '-m', 'framework_bench.measure.clock', str(job.run_dir), str(job.scenario.steps.warmup)] + (['all'] if job.device == 'cuda' else []))} &",
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


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


@dataclass
class Outcome:
    status: Literal["ok", "failed", "oom", "timeout", "interrupted"]
    returncode: int | None
    seconds: float
    log_tail: str


def tail(path: Path, lines: int = 30) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def node_log(log_path: Path, node: int) -> Path:
    return log_path if node == 0 else log_path.with_name(f"{log_path.stem}.node{node}{log_path.suffix}")


HOST_PID_ENV = "FBENCH_HOST_PID"  # a worker (or its SDK) may watch the host itself: torchrun's children too
PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Neither is given to a SLURM job: its processes are the scheduler's, ended with the job, and
# the host that submitted it may well be gone by design (`results collect` later).


def _parent_death_signal() -> Callable[[], None] | None:
    """A `preexec_fn` making the started process get SIGTERM when the host dies (Linux
    `PR_SET_PDEATHSIG`), so a `kill -9` of fbench cannot leave a worker training for ever;
    None where prctl is not to be had. SIGTERM, not SIGKILL: torchrun then stops its workers."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    host = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != host:  # the host died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm



def execute(
    argvs: list[list[str]],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    timeout: float | None = None,
    poll: Callable[[], None] = lambda: None,
) -> Outcome:
    """Run each argv (one per node: several torchrun invocations meet at one rendezvous) in its
    own process group, output to `log_path` (node i > 0: `<stem>.node<i>.log`). Calls `poll`
    about twice a second. When one process fails, the others are stopped: they would hang.
    However it ends (an exception in `poll` too), no process of these groups is left running."""
    started = time.monotonic()
    oom_kills_before = kernel_oom_kills()
    logs = [node_log(log_path, i) for i in range(len(argvs))]
    procs: list[subprocess.Popen] = []
    first_bad: int | None = None
    child_env = {**os.environ, **env, HOST_PID_ENV: str(os.getpid())}
    with ExitStack() as stack:
        try:  # starting too: an interrupt between two nodes' starts must stop the first
            for argv, path in zip(argvs, logs):
                log = stack.enter_context(path.open("ab"))
                log.write(f"$ {' '.join(argv)}\n".encode())
                log.flush()
                try:
                    procs.append(subprocess.Popen(argv, cwd=cwd, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                                  preexec_fn=_parent_death_signal()))
                except (OSError, ValueError, subprocess.SubprocessError) as e:  # no such Python, a NUL, E2BIG
                    _kill_all(procs)
                    return Outcome("failed", None, time.monotonic() - started,
                                   f"[fbench] could not start {argv[0]}: {type(e).__name__}: {e}")
            while None in (codes := [p.poll() for p in procs]):
                first_bad = next((i for i, rc in enumerate(codes) if rc not in (None, 0)), None)
                if first_bad is not None:
                    break
                time.sleep(0.5)
                poll()
                if timeout is not None and time.monotonic() - started > timeout:
                    _kill_all(procs)
                    return Outcome("timeout", None, time.monotonic() - started,
                                   tail(log_path) + f"\n[fbench] killed after the {timeout:g} s timeout")
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP where the CLI maps them so
            with interrupts.held(reraise=False):  # a second Ctrl-C must not orphan the workers
                _kill_all(procs)
            return Outcome("interrupted", None, time.monotonic() - started, tail(log_path))
        except BaseException:
            _kill_all(procs)
            raise
        _kill_all(procs)
    poll()
    seconds = time.monotonic() - started
    if first_bad is None:
        first_bad = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
    if first_bad is None:
        return Outcome("ok", 0, seconds, tail(log_path))
    rc, path = procs[first_bad].returncode, logs[first_bad]
    # An OOM needs evidence: its message in any rank's log (every node's whole log: the rank
    # that ran out may not be the last to write), or a kill by the kernel's OOM killer in
    # this cgroup. A SIGKILL alone may be anyone's.
    marker = next((m for m in OOM_MARKERS if any(_log_contains(log, m) for log in logs)), None)
    kernel = kernel_oom_kills()
    killed_by_oom = kernel is not None and oom_kills_before is not None and kernel > oom_kills_before
    note = ""
    if marker is None and killed_by_oom:
        note = "\n[fbench] the kernel's OOM killer stopped a process of this run (cgroup memory.events)"
    elif marker is None and rc is not None and rc < 0:
        note = f"\n[fbench] killed by {signal.Signals(-rc).name}, with no sign of running out of memory"
    status = "oom" if marker or killed_by_oom else "failed"
    return Outcome(status, rc, seconds, tail(path) + note)


def _log_contains(path: Path, needle: str) -> bool:
    """Whether `needle` occurs anywhere in the file, read in 1 MiB pieces that overlap."""
    pattern, keep = needle.encode(), len(needle.encode()) - 1
    try:
        with path.open("rb") as fh:
            previous = b""
            while chunk := fh.read(1 << 20):
                if pattern in previous + chunk:
                    return True
                previous = chunk[-keep:] if keep else b""
    except OSError:
        return False
    return False


def kernel_oom_kills() -> int | None:
    """How many processes the kernel's OOM killer has killed in this process's cgroup (v2), or
    None where that is not readable."""
    try:
        line = next(l for l in Path("/proc/self/cgroup").read_text().splitlines() if l.startswith("0::"))
        events = Path("/sys/fs/cgroup", line[3:].lstrip("/"), "memory.events").read_text()
    except (OSError, StopIteration):
        return None
    counts = dict(l.split() for l in events.splitlines() if len(l.split()) == 2)
    return int(counts["oom_kill"]) if counts.get("oom_kill", "").isdigit() else None


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        _kill(proc)


def _kill(proc: subprocess.Popen) -> None:
    """Stop the whole process group (torchrun's children, anything a worker left behind when
    it exited): TERM, then KILL. The group keeps the leader's pid while any member lives."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            try:
                os.killpg(proc.pid, 0)  # the leader is gone: are other members left?
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
