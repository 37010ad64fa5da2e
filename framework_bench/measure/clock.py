"""The host's own clock, watching while the run goes. The worker SDK's step timer writes a line
per clock event (begin, pause, resume, end: `framework_bench/worker/steps.py`) the moment it
happens, carrying no time; `Watcher` stamps each line as it arrives with the host's monotonic
clock, warm-up steps too. On CPU runs it also reads, at each stamp, the CPU time of the host's
process tree (the worker, torchrun, its ranks, and whatever they started: every process found
at that stamp, with the time of the children they reaped; `tree_cpu_seconds`): the time its
threads ran, and the time they waited runnable for a CPU; and the whole machine's busy time,
which less the tree's is the other
work the run shared the machine with. It stamps the worker's update claims (`UPDATE_FILE`, the
warm-up's `WARMUP_UPDATE_FILE`) when they appear, reveals the initial seed of the trained weights
once every rank said it is ready for its first step, the seed of the projection at the warm-up's
end once every rank ended the last warm-up step, and the update projection's seed once every rank
ended the last step (`framework_bench/measure/update.py`), noting then how far the loss records reach, and on GPU
records what NVML reports over the steps (`framework_bench/measure/nvml.py`, never judged). The stamps are kept in the run folder
(`STAMPS_FILE`); `clock_checks.py` judges them after the run.

Under SLURM the batch script's one task per node is this module (`python -m
framework_bench.measure.clock RUN_DIR WARMUP STEPS RANKS [cpu|all] -- COMMAND...`, its projection seed
on its standard input): on the job's first node it starts the node's workers (COMMAND) and watches
them as the local launcher's watcher does, their CPU time read as descendants of the watcher; lines
of ranks on other nodes reach it through the shared filesystem, read every 0.1 s (no CPU time is
read for a run on several nodes: the other nodes' workers are none of its descendants).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from framework_bench.envs.children import dies_with_this_process
from framework_bench.measure import processes
from framework_bench.measure.nvml import NvmlSampler
from framework_bench.measure import update
from framework_bench.measure.update import Reveal
from framework_bench.worker.files import CLOCK_DIR, UPDATE_FILE
from framework_bench.worker.losses import LOSSES_DIR
from framework_bench.worker.update import WARMUP_UPDATE_FILE

STAMPS_FILE = "host_clock.json"
POLL_SECONDS = 0.005  # without inotify, a stamp is at most this late (plus scheduling)


def tree_cpu_seconds(root: int) -> tuple[float, float] | None:
    """(seconds the processes descending from `root` ran on a CPU or waited, runnable, for one;
    seconds they ran), every one of them found now (/proc's parent links: a process started since
    the last read, or adopted by a subreaper, is there), and the children `root` reaped (its own
    time is not counted: the watcher's); None without /proc. Each process counts its live
    threads' run time (schedstat), or every thread's, the ended ones' too, where that is more
    (utime + stime), and its children's that ended and were waited for (cutime + cstime: a child
    that trained and was reaped between two stamps). A checked figure is the difference of two
    readings: what `root` reaped before the run is the same in both. The wait counts in the first:
    on a machine shared with other work an honest worker waits for a CPU; a worker asleep through
    its steps neither runs nor waits. The second is the work done, whatever else the machine runs."""
    if (own := processes.cpu(root)) is None:  # no /proc
        return None
    total = ran = own.reaped
    for pid in processes.descendants(processes.table(), root):
        if (c := processes.cpu(pid)) is None:  # ended since: its time is in its parent's once reaped
            continue
        work = max(c.ran, c.own) + c.reaped
        total, ran = total + work + c.waited, ran + work
    return total, ran


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy (every process, all CPUs: /proc/stat's first
    line less idle and iowait), None where it cannot be read. Less the run's own, it is the other
    work the run shared the machine with."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields)
    except (OSError, ValueError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def written_losses(run_dir: Path) -> dict[str, dict]:
    """{rank: {"bytes", "sha256", "to_step"}} of each rank's loss records file as it is now: its
    whole lines (a record being written is left out), their digest, the last step they reach."""
    out = {}
    for path in sorted((Path(run_dir) / LOSSES_DIR).glob("rank*.jsonl")):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        data = data[:data.rfind(b"\n") + 1]
        steps = []
        for line in data.splitlines():
            try:
                steps.append(int(json.loads(line)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
        out[path.stem.removeprefix("rank")] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                               "to_step": max(steps, default=0)}
    return out


class Inotify:
    """Linux inotify on folders (libc through ctypes), each with its event mask: `wait`
    returns as soon as one of them sees such an event, so the watcher sleeps between lines
    instead of polling."""

    IN_MODIFY, IN_MOVED_TO, IN_CREATE, IN_NONBLOCK, IN_CLOEXEC = 0x2, 0x80, 0x100, 0o4000, 0o2000000

    def __init__(self, folders: dict[Path, int]):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
        if self.fd < 0 or any(libc.inotify_add_watch(self.fd, os.fsencode(folder), mask) < 0
                              for folder, mask in folders.items()):
            raise OSError(ctypes.get_errno(), "inotify unavailable")
        self.poller = select.poll()
        self.poller.register(self.fd, select.POLLIN)

    def wait(self, timeout: float) -> None:
        if self.poller.poll(timeout * 1000):
            try:
                while os.read(self.fd, 1 << 16):
                    pass
            except BlockingIOError:
                pass

    def close(self) -> None:
        os.close(self.fd)


class Watcher:
    """Stamps the run's clock lines as they arrive: a thread woken by inotify when a clock
    file is written (elsewhere: polling every `POLL_SECONDS`), reading each rank's file.
    Use as a context manager around the launch; on exit the stamps are written to
    `run_dir/STAMPS_FILE`."""

    def __init__(self, run_dir: Path, warmup: int, cpu: bool, gpus: str | None = None, reveal: Reveal | None = None):
        """`cpu`: read the process tree's CPU share; `gpus`: sample NVML for these GPU indices
        ("all": every GPU of the node; None: no GPU run); `reveal`: the projection seed to
        reveal once every rank ended the last step (`framework_bench/measure/update.py`)."""
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / CLOCK_DIR
        self.dir.mkdir(parents=True, exist_ok=True)  # here before the worker, for inotify to watch
        self.out = self.run_dir / STAMPS_FILE
        self.warmup, self.cpu = warmup, cpu
        self.nvml = NvmlSampler(gpus) if gpus else None
        # rank -> [stamp, event, step, cpu and wait seconds, cpu seconds, the machine's busy seconds]
        self.events: dict[int, list[list]] = {}
        self._files: dict[int, tuple[int, bytearray]] = {}
        self._last_end: dict[int, int] = {}
        # the process tree's CPU seconds never read lower than before; the last reading, by stamp
        self._cpu_floor: tuple[float, float] = (0.0, 0.0)
        self._cpu_read: tuple[float, tuple | None] | None = None
        self.reveal, self.revealed = reveal, None  # revealed: {"seed", "stamp"} once written
        self.initial_revealed: dict | None = None  # {"seed", "stamp"} once the initial seed was written
        self._ready: set[int] = set()
        self.update_claim: dict | None = None  # {"stamp"} when the worker's update claim appeared
        self.warmup_revealed: dict | None = None  # {"seed", "stamp", "after_step"} once the warm-up's seed was written
        self.warmup_claim: dict | None = None  # {"stamp"} when the worker's projection at the warm-up's end appeared
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fbench-clock", daemon=True)

    def __enter__(self) -> Watcher:
        self._thread.start()
        if self.nvml:
            self.nvml.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join()
        self._read()
        self._see_update_claim()
        for fd, _ in self._files.values():
            os.close(fd)
        nvml = self.nvml.stop() if self.nvml else None
        try:
            self.out.write_text(json.dumps({"warmup": self.warmup, "cpu_read": self.cpu, "cpus": os.cpu_count(), "nvml": nvml,
                                            "initial_reveal": self.initial_revealed, "reveal": self.revealed,
                                            "update_claim": self.update_claim, "warmup_reveal": self.warmup_revealed,
                                            "warmup_update_claim": self.warmup_claim,
                                            "ranks": {str(r): ev for r, ev in self.events.items()}}))
        except OSError:  # a full disk: the run is still read back; its clock is then unverified, said so
            pass

    def _run(self) -> None:
        try:
            # the clock lines written; the update claim renamed (or written) into the run folder
            notify = Inotify({self.dir: Inotify.IN_MODIFY | Inotify.IN_CREATE,
                              self.run_dir: Inotify.IN_MOVED_TO | Inotify.IN_CREATE})
        except (OSError, AttributeError):  # no inotify (not Linux): poll
            notify = None
        polls = 0
        while not self._stop.is_set():
            if notify:
                notify.wait(timeout=0.1)  # the timeout only to see the stop
            else:
                time.sleep(POLL_SECONDS)
            if notify or polls % 100 == 0:  # new ranks' files
                self._open_new()
            polls += 1
            self._read()
            self._see_update_claim()
            if self.warmup_revealed is not None:
                self._see_warmup_claim(time.monotonic())
        if notify:
            notify.close()

    def _open_new(self) -> None:
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return
        for entry in entries:
            stem = entry.name.removesuffix(".jsonl").removeprefix("rank")
            if stem.isascii() and stem.isdigit() and int(stem) not in self._files:
                try:
                    self._files[int(stem)] = (os.open(entry.path, os.O_RDONLY), bytearray())
                except OSError:
                    continue

    def _read(self) -> None:
        for rank, (fd, pending) in self._files.items():
            while chunk := os.read(fd, 1 << 16):
                pending += chunk
            if b"\n" not in pending:
                continue
            stamp = time.monotonic()
            *lines, rest = pending.split(b"\n")
            pending[:] = rest
            for line in lines:
                self._stamp(rank, stamp, line)

    def _stamp(self, rank: int, stamp: float, line: bytes) -> None:
        try:
            rec = json.loads(line)
            event, step = str(rec["event"]), rec.get("step")
        except (ValueError, KeyError, TypeError):
            return  # not a clock line: no claim made, nothing stamped
        cpu = self._cpu(stamp)
        if event == "end" and isinstance(step, int):
            self._last_end[rank] = step
            self._reveal_warmup(stamp)
            self._reveal_after(stamp)
        elif event == "begin" and self.warmup_claim is None and self.warmup_revealed is not None:
            self._see_warmup_claim(stamp)  # the claim is renamed into place before this line is written
        elif event == "ready":
            self._ready.add(rank)
            self._reveal_initial(stamp, cpu)
        self.events.setdefault(rank, []).append([stamp, event, step, *(cpu or (None, None, None))])

    def _cpu(self, stamp: float) -> tuple[float, float, float | None] | None:
        """The process tree's CPU seconds at `stamp` (`tree_cpu_seconds`, read once for the lines
        stamped together) and the machine's busy seconds (`machine_busy_seconds`), on CPU runs.
        Never below an earlier reading: a process that ends takes its wait for a CPU with it, and
        its run time is then read in clock ticks."""
        if not self.cpu:
            return None
        if self._cpu_read is None or self._cpu_read[0] != stamp:
            tree = tree_cpu_seconds(os.getpid())
            if tree is not None:
                self._cpu_floor = (max(tree[0], self._cpu_floor[0]), max(tree[1], self._cpu_floor[1]))
                tree = (*self._cpu_floor, machine_busy_seconds())
            self._cpu_read = (stamp, tree)
        return self._cpu_read[1]

    def _see_update_claim(self) -> None:
        """Stamp the worker's update claim (`UPDATE_FILE`) when it first shows in the run folder:
        the time from the reveal to it is the projection's, unless the worker trained there."""
        if self.update_claim is None and (self.run_dir / UPDATE_FILE).exists():
            self.update_claim = {"stamp": time.monotonic()}

    def _see_warmup_claim(self, stamp: float) -> None:
        """Stamp the worker's projection at the warm-up's end when it first shows in the run folder
        (at the latest with the begin line written after it: so it is stamped no later than that)."""
        if self.warmup_claim is None and (self.run_dir / WARMUP_UPDATE_FILE).exists():
            self.warmup_claim = {"stamp": stamp}

    def _reveal_warmup(self, stamp: float) -> None:
        """Reveal the seed of the projection at the warm-up's end once every rank's clock says it
        ended the last warm-up step (none without warm-up steps)."""
        if self.reveal is None or self.warmup_revealed is not None or not self.warmup:
            return
        if sum(step >= self.warmup for step in self._last_end.values()) >= self.reveal.ranks:
            try:
                self.reveal.write_warmup(self.run_dir)
            except OSError:  # a full disk: no seed, so no projection; the claim is then missing
                return
            self.warmup_revealed = {"seed": self.reveal.warmup_seed, "stamp": stamp, "after_step": self.warmup}

    def _reveal_initial(self, stamp: float, cpu: tuple | None) -> None:
        """Reveal the initial seed once every rank said it is ready for its first step."""
        if self.reveal is None or self.initial_revealed is not None or len(self._ready) < self.reveal.ranks:
            return
        try:
            self.reveal.write_initial(self.run_dir)
        except OSError:  # a full disk: the worker waits in vain and times out, saying so
            return
        self.initial_revealed = {"seed": self.reveal.initial_seed, "stamp": stamp, "cpu": cpu[1] if cpu else None,
                                 "busy": cpu[2] if cpu else None}

    def _reveal_after(self, stamp: float) -> None:
        """Reveal the seed once every rank's clock says it ended the last step."""
        if self.reveal is None or self.revealed is not None:
            return
        if sum(step >= self.reveal.after_step for step in self._last_end.values()) >= self.reveal.ranks:
            try:
                self.reveal.write(self.run_dir)
            except OSError:  # a full disk: no seed, so no projection; the run's update claim is then missing
                return
            # The loss records as they stand at the reveal: a loss can only be known once the
            # steps before it trained, so training after the last step shows as records not yet
            # written, or rewritten since (`clock_checks.losses_in_time_check`).
            self.revealed = {"seed": self.reveal.seed, "stamp": stamp, "after_step": self.reveal.after_step,
                             "losses": written_losses(self.run_dir)}


def _watch_on_node(argv: list[str]) -> int:
    """A SLURM run's task on each node: `RUN_DIR WARMUP STEPS RANKS [cpu|all] -- COMMAND...` (`cpu`:
    read the workers' CPU time; `all`: sample every GPU of the node). On the job's first node it
    starts COMMAND (the worker, or torchrun) under the watcher and returns its exit status; on
    another node it becomes COMMAND. Without a COMMAND (a batch script written by an earlier fbench)
    it watches beside the workers until SIGTERM.

    The projection seed is the first line of its standard input: the batch script draws one per job
    and pipes it to the watcher of each run it holds (a SLURM round), so that the round's runs share
    one projection vector, while no worker can read it (never in an argument or the environment, and
    the workers' standard input is /dev/null)."""
    head, command = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    run_dir, warmup, steps, ranks, *reads = head
    if command and os.environ.get("SLURM_NODEID", "0") != "0":
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.execvp(command[0], command)
    if not command:
        # SIGTERM waited for, not handled: a handler setting an Event can deadlock on the lock the main
        # thread holds inside Event.wait, leaving the batch script waiting for the watcher forever.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    projection = int(sys.stdin.readline())
    reveal = Reveal(after_step=int(steps), ranks=int(ranks), seed=projection,
                    initial_seed=update.derived_initial_seed(projection),
                    warmup_seed=update.derived_warmup_seed(projection, None))
    with Watcher(Path(run_dir), int(warmup), cpu="cpu" in reads, gpus="all" if "all" in reads else None,
                 reveal=reveal):
        if not command:
            signal.sigwait({signal.SIGTERM})
            return 0
        # SIGTERM ends the watcher (SLURM's time limit, scancel): the kernel then ends the worker too.
        code = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                preexec_fn=dies_with_this_process(signal.SIGTERM)).wait()
    return code if code >= 0 else 128 - code  # killed by a signal: the status a shell gives


if __name__ == "__main__":
    sys.exit(_watch_on_node(sys.argv[1:]))
