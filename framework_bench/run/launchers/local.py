"""The `local` launcher: the worker module as one process of this machine, in its own process
group, watched until it ends; and the process-tree runner the `torchrun` launcher shares.
What the worker started outside its group ends with it too (`descendants.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from framework_bench.envs.children import dies_with_this_process
from framework_bench.envs.venvs import bytecode_dir
from framework_bench.measure import clock, update
from framework_bench.plugins.contract import Job, LaunchPlan
from framework_bench.run import interrupts
from framework_bench.plugins.plan_env import visible_gpus_env
from framework_bench.run.launchers.base import OOM_MARKERS, Executor, LaunchOptions, Outcome, tail
from framework_bench.run.launchers.descendants import RUN_ENV, RunTree


class LocalExecutor(Executor):
    name = "local"

    def argv(self, plan: LaunchPlan, job: Job) -> list[str]:
        if job.nprocs * job.nnodes > 1:
            raise ValueError(f"{job.nprocs * job.nnodes} processes need --launcher torchrun")
        return [str(plan.python), "-m", plan.module, *plan.args]

    def start(self, plan: LaunchPlan, job: Job, options: LaunchOptions, gpu_name: str | None,
              poll: Callable[[], None]) -> Outcome:
        argvs = self.node_argvs(plan, job)
        # The host's own clock stamps the worker's clock lines as they arrive (framework_bench/measure/clock.py).
        gpus = visible_gpus_env(job, {**os.environ, **plan.env}).get("CUDA_VISIBLE_DEVICES")
        reveal = update.Reveal(after_step=job.scenario.steps.total, ranks=job.scenario.cluster.gpus,
                               seed=update.projection_seed(job.scenario.name, job.seed, options.projection_round),
                               initial_seed=update.initial_seed(job.seed, options.projection_round, options.pinned_seed))
        with clock.Watcher(job.run_dir, job.scenario.steps.warmup, cpu=job.device == "cpu", gpus=gpus, reveal=reveal):
            return execute(argvs, plan.env, job.run_dir, job.run_dir / "worker.log", options.timeout, poll)


def node_log(log_path: Path, node: int) -> Path:
    return log_path if node == 0 else log_path.with_name(f"{log_path.stem}.node{node}{log_path.suffix}")


HOST_PID_ENV = "FBENCH_HOST_PID"  # a worker (or its SDK) may watch the host itself: torchrun's children too
# The worker gets SIGTERM should the host die (SIGTERM, not SIGKILL: torchrun then stops its
# workers). Neither this nor HOST_PID_ENV is given to a SLURM job: its processes are the
# scheduler's, ended with the job, and the host that submitted it may well be gone by design.



# The backend envs are installed without bytecode (pip --no-compile, for install time). Where the
# shell says not to write bytecode, every run compiled torch, transformers and its framework from
# source before its first step (docs/calibration.md: LLaMA-Factory's imports took 25 s so, 9 s from
# bytecode). There a worker writes it instead beside the envs (`bytecode_dir`), never into an env,
# a machine's own site-packages or the checkout, and later runs read it from there.
NO_BYTECODE, BYTECODE_PREFIX = "PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"


def inherited_environ() -> dict[str, str]:
    """This process's environment for a worker: where it forbids bytecode, bytecode written beside
    the envs instead (a prefix the user set stays theirs; a plan may still forbid it)."""
    environ = dict(os.environ)
    if environ.pop(NO_BYTECODE, ""):
        environ.setdefault(BYTECODE_PREFIX, str(bytecode_dir()))
    return environ


def execute(
    argvs: list[list[str]],
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    timeout: float | None = None,
    poll: Callable[[], None] = lambda: None,
) -> Outcome:
    """Run each argv (one per node: several torchrun invocations meet at one rendezvous) in its
    own process group, in `cwd` (the run folder), output to `log_path` (node i > 0:
    `<stem>.node<i>.log`). Calls `poll` about twice a second. When one process fails, the
    others are stopped: they would hang. However it ends (an exception in `poll` too), no
    process of these groups is left running, nor any other the processes started (`RunTree`)."""
    started = time.monotonic()
    oom_kills_before = kernel_oom_kills()
    logs = [node_log(log_path, i) for i in range(len(argvs))]
    procs: list[subprocess.Popen] = []
    first_bad: int | None = None
    child_env = {**inherited_environ(), **env, HOST_PID_ENV: str(os.getpid()), RUN_ENV: str(cwd)}
    with ExitStack() as stack:
        tree = stack.enter_context(RunTree(procs))
        try:  # starting too: an interrupt between two nodes' starts must stop the first
            for argv, path in zip(argvs, logs):
                log = stack.enter_context(path.open("ab"))
                log.write(f"$ {' '.join(argv)}\n".encode())
                log.flush()
                try:
                    procs.append(subprocess.Popen(argv, cwd=cwd, env=child_env, stdout=log, stderr=subprocess.STDOUT,
                                                  stdin=subprocess.DEVNULL, start_new_session=True,
                                                  preexec_fn=dies_with_this_process(signal.SIGTERM)))
                except (OSError, ValueError, subprocess.SubprocessError) as e:  # no such Python, a NUL, E2BIG
                    _kill_all(procs, tree)
                    return Outcome("failed", None, time.monotonic() - started,
                                   f"[fbench] could not start {argv[0]}: {type(e).__name__}: {e}")
            while None in (codes := [p.poll() for p in procs]):
                first_bad = next((i for i, rc in enumerate(codes) if rc not in (None, 0)), None)
                if first_bad is not None:
                    break
                try:  # half a second, or less when the process ends: no time lost after the last step
                    next(p for p in procs if p.returncode is None).wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    pass
                poll()
                if timeout is not None and time.monotonic() - started > timeout:
                    _kill_all(procs, tree)
                    return Outcome("timeout", None, time.monotonic() - started,
                                   tail(log_path) + f"\n[fbench] killed after the {timeout:g} s timeout")
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP where the CLI maps them so
            with interrupts.held(reraise=False):  # a second Ctrl-C must not orphan the workers
                _kill_all(procs, tree)
            return Outcome("interrupted", None, time.monotonic() - started, tail(log_path))
        except BaseException:
            with interrupts.held():  # a Ctrl-C meanwhile: raised once all is stopped
                _kill_all(procs, tree)
            raise
        with interrupts.held():
            _kill_all(procs, tree)
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
    return int(counts["oom_kill"]) if counts.get("oom_kill", "").isascii() and counts["oom_kill"].isdigit() else None


def _kill_all(procs: list[subprocess.Popen], tree: RunTree) -> None:
    for proc in procs:
        _kill(proc, tree)
    tree.end(STOP_GRACE_S)


STOP_GRACE_S = 10.0  # a worker's time to end on SIGTERM (its framework's own handlers) before SIGKILL


def _kill(proc: subprocess.Popen, tree: RunTree) -> None:
    """Stop the whole process group (anything a worker left behind in it when it exited): TERM,
    then KILL. The group keeps the leader's pid while any member lives. What left the group
    (torchrun's workers: each in a session of its own) is `tree`'s to end."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.1)
            except subprocess.TimeoutExpired:
                continue
            tree.reap()  # members the host adopted, ended: a zombie keeps the group
            try:
                os.killpg(proc.pid, 0)  # the leader is gone: are other members left?
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)
