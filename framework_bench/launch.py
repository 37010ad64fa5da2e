"""Launchers: turn a backend's plan into a process tree, watch it, and classify how it ended.

`local` runs the worker module as one process; `torchrun` wraps it in
`python -m torch.distributed.run` from the backend's own env (the host has no torch);
`slurm` writes an sbatch script whose one `srun` task per node starts that torchrun, with
the rendezvous host taken from the allocation.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from framework_bench.backend import Job, LaunchPlan

Launcher = Literal["local", "torchrun", "slurm"]
RDZV_PORT = 29500
OOM_MARKERS = ("CUDA out of memory", "OutOfMemoryError", "torch.OutOfMemoryError", "Cannot allocate memory")


def torchrun_argv(plan: LaunchPlan, job: Job, endpoint: str = "127.0.0.1:29500", node_rank: int | None = None) -> list[str]:
    argv = [str(plan.python), "-m", "torch.distributed.run",
            "--nnodes", str(job.nnodes), "--nproc-per-node", str(job.nprocs),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if node_rank is not None:
        argv += ["--node-rank", str(node_rank)]
    return argv + ["-m", plan.module, *plan.args]


def argv_for(plan: LaunchPlan, job: Job, launcher: Launcher) -> list[str]:
    if launcher == "local":
        if job.nprocs * job.nnodes > 1:
            raise ValueError(f"{job.nprocs * job.nnodes} processes need --launcher torchrun")
        return [str(plan.python), "-m", plan.module, *plan.args]
    if launcher == "slurm":
        return ["sbatch", str(sbatch_path(job))]
    return torchrun_argv(plan, job)


def sbatch_path(job: Job) -> Path:
    return job.run_dir / "submit.sbatch"


def sbatch_script(plan: LaunchPlan, job: Job, time_limit: str = "02:00:00") -> str:
    """A submit-ready sbatch script: one srun task per node, each running torchrun over that
    node's GPUs; the rendezvous endpoint is the allocation's first host."""
    torchrun = torchrun_argv(plan, job, endpoint="@ENDPOINT@")
    cut = torchrun.index("-m", 1 + torchrun.index("c10d"))  # launcher options end where the worker starts
    torchrun[cut:cut] = ["--rdzv-id", "@JOBID@"]
    command = shlex.join(torchrun)
    command = command.replace("@ENDPOINT@", f'"$head_node:{RDZV_PORT}"').replace("@JOBID@", '"$SLURM_JOB_ID"')
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=fbench-{job.scenario.name}-{job.backend}",
        f"#SBATCH --nodes={job.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={job.nprocs}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"#SBATCH --output={job.run_dir}/slurm-%j.out",
        f"# Written by fbench: scenario {job.scenario.name}, backend {job.backend}.",
        "set -euo pipefail",
        f"cd {shlex.quote(str(job.run_dir))}",
        *(f"export {k}={shlex.quote(v)}" for k, v in sorted(plan.env.items())),
        'head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"# One task per node: torchrun starts {job.nprocs} workers there and meets the other nodes at $head_node.",
        f"srun --nodes={job.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {command}",
    ]
    return "\n".join(lines) + "\n"


def write_sbatch(plan: LaunchPlan, job: Job, time_limit: str = "02:00:00") -> Path:
    path = sbatch_path(job)
    path.write_text(sbatch_script(plan, job, time_limit))
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


def execute(
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    timeout: float | None = None,
    poll: Callable[[], None] = lambda: None,
) -> Outcome:
    """Run `argv` in its own process group, output to `log_path`; call `poll` about twice a second."""
    started = time.monotonic()
    with log_path.open("ab") as log:
        log.write(f"$ {' '.join(argv)}\n".encode())
        log.flush()
        proc = subprocess.Popen(argv, cwd=cwd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    poll()
                    if timeout is not None and time.monotonic() - started > timeout:
                        _kill(proc)
                        return Outcome("timeout", None, time.monotonic() - started,
                                       tail(log_path) + f"\n[fbench] killed after the {timeout:g} s timeout")
        except KeyboardInterrupt:
            _kill(proc)
            return Outcome("interrupted", None, time.monotonic() - started, tail(log_path))
    poll()
    seconds = time.monotonic() - started
    text = tail(log_path, 200)
    if rc == 0:
        return Outcome("ok", rc, seconds, tail(log_path))
    # SIGKILL from the kernel's OOM killer shows up as -9; a CUDA OOM as its exception text.
    oom = rc in (-signal.SIGKILL, 128 + signal.SIGKILL) or any(m in text for m in OOM_MARKERS)
    return Outcome("oom" if oom else "failed", rc, seconds, tail(log_path))


def _kill(proc: subprocess.Popen) -> None:
    """Stop the whole process group (torchrun's children too): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue
