"""The host's own clock: the time a run took, as the host saw it, held against the seconds
its worker claims.

The worker SDK's step timer writes a line per clock event (`framework_bench/worker/steps.py`:
begin, pause, resume, end) the moment it happens, carrying no time. While the run goes,
`Watcher` reads those files and stamps each line as it arrives with the host's monotonic
clock; on CPU it also reads the CPU time (and run-queue wait) of the host's process tree
(the worker, torchrun, its ranks) at each stamp of a measured step. The stamps are kept in the run folder
(`STAMPS_FILE`), and `checks` judges them after the run, per rank, over the measured steps:

  - clock: the claimed seconds must be at least `MIN_CLAIMED_SHARE` of the observed span
    (first measured begin to the last measured step's stop) less the declared pauses;
  - pauses: a step's declared pauses (pause ... resume) may not exceed `MAX_PAUSE_SHARE` of
    the step: the rows are packed beforehand, there is nothing legitimate to wait for;
  - cpu (CPU runs): the process tree's CPU time over the span, with the time its threads
    waited runnable for a CPU (a shared machine starves honest workers too), at least
    `MIN_CPU_SHARE` of its wall time: a worker asleep through its steps computed them
    elsewhere (where /proc cannot be read, or the span is too short to, it is said unavailable).

Once every rank's last step ended, the watcher reveals the update projection's seed
(`framework_bench/measure/update.py`), keeping the stamp in its record.

Under SLURM the batch script runs the watcher on the job's first node, beside the workers
(`python -m framework_bench.measure.clock RUN_DIR WARMUP STEPS RANKS [all]`, stopped by SIGTERM once they end): lines
of ranks on other nodes reach it through the shared filesystem, read every 0.1 s, and the
CPU share is not read there (the workers are no descendants of the watcher).

On GPU the watcher also records what NVML reports over the measured steps (busy samples,
energy: `framework_bench/measure/nvml.py`), "unavailable" where it cannot be read; never a pass or a fail.

A pause not followed by a resume stops the step's clock (its `end` line may come later, once
the framework logged the loss). `FBENCH_UNCHECKED=clock,pauses,cpu` leaves these checks out
(`framework_bench/measure/verify.py`): for tests that show a lie is live; never for a figure
anyone reads.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import select
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from framework_bench.measure.nvml import NvmlSampler, nvml_figures
from framework_bench.measure.update import Reveal
from framework_bench.worker.files import CLOCK_DIR

STAMPS_FILE = "host_clock.json"
POLL_SECONDS = 0.005  # without inotify, a stamp is at most this late (plus scheduling)
MIN_CLAIMED_SHARE = 0.9
MAX_PAUSE_SHARE = 0.05
MIN_CPU_SHARE = 0.5
MIN_CPU_SPAN_SECONDS = 0.2  # a shorter span says nothing: a thread's schedstat is brought up to date as it is scheduled


def _children(pid: int) -> dict[int, list[int]]:
    """{parent pid: child pids} of every process /proc lists."""
    out: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rpartition(")")[2].split()[1])
            out.setdefault(ppid, []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    tree, found, todo = _children(pid), [], [pid]
    while todo:
        kids = tree.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def cpu_seconds(pids: list[int]) -> float | None:
    """Seconds the processes' threads ran on a CPU or waited, runnable, for one
    (/proc/PID/task/TID/schedstat); None where no such file can be read. The wait counts: on
    a machine shared with other work an honest worker waits for a CPU; a worker asleep
    through its steps neither runs nor waits."""
    total, seen = 0, False
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:  # ended since: its time is lost, which only lowers the share
            continue
        for tid in tasks:
            try:
                ran, waited = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
            except (OSError, ValueError):
                continue
            total += int(ran) + int(waited)
            seen = True
    return total / 1e9 if seen else None


class Inotify:
    """Linux inotify on one folder (libc through ctypes): `wait` returns as soon as a file
    in it is written, so the watcher sleeps between lines instead of polling."""

    IN_MODIFY, IN_CREATE, IN_NONBLOCK, IN_CLOEXEC = 0x2, 0x100, 0o4000, 0o2000000

    def __init__(self, directory: Path):
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(self.IN_NONBLOCK | self.IN_CLOEXEC)
        if self.fd < 0 or libc.inotify_add_watch(self.fd, os.fsencode(directory), self.IN_MODIFY | self.IN_CREATE) < 0:
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
        self.events: dict[int, list[list]] = {}  # rank -> [stamp, event, step, cpu seconds or None]
        self._files: dict[int, tuple[int, bytearray]] = {}
        self._measuring: dict[int, bool] = {}
        self._last_end: dict[int, int] = {}
        self._pids: list[int] | None = None
        self.reveal, self.revealed = reveal, None  # revealed: {"seed", "stamp"} once written
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
        for fd, _ in self._files.values():
            os.close(fd)
        nvml = self.nvml.stop() if self.nvml else None
        try:
            self.out.write_text(json.dumps({"warmup": self.warmup, "cpu_read": self.cpu, "nvml": nvml,
                                            "reveal": self.revealed,
                                            "ranks": {str(r): ev for r, ev in self.events.items()}}))
        except OSError:  # a full disk: the run is still read back; its clock is then unverified, said so
            pass

    def _run(self) -> None:
        try:
            notify = Inotify(self.dir)
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
        if notify:
            notify.close()

    def _open_new(self) -> None:
        try:
            entries = list(os.scandir(self.dir))
        except OSError:
            return
        for entry in entries:
            stem = entry.name.removesuffix(".jsonl").removeprefix("rank")
            if stem.isdigit() and int(stem) not in self._files:
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
        if event == "begin" and self._last_end.get(rank, 0) >= self.warmup:
            self._measuring[rank] = True
        cpu = None
        if self.cpu and self._measuring.get(rank):
            if self._pids is None:  # the process tree, found once: the workers exist by now
                self._pids = descendants(os.getpid())
            cpu = cpu_seconds(self._pids)
        if event == "end" and isinstance(step, int):
            self._last_end[rank] = step
            self._reveal_after(stamp)
        self.events.setdefault(rank, []).append([stamp, event, step, cpu])

    def _reveal_after(self, stamp: float) -> None:
        """Reveal the seed once every rank's clock says it ended the last step."""
        if self.reveal is None or self.revealed is not None:
            return
        if sum(step >= self.reveal.after_step for step in self._last_end.values()) >= self.reveal.ranks:
            try:
                self.reveal.write(self.run_dir)
            except OSError:  # a full disk: no seed, so no projection; the run's update claim is then missing
                return
            self.revealed = {"seed": self.reveal.seed, "stamp": stamp}


@dataclass
class StepWindow:
    """One step of one rank as the host stamped it: its clock ran from `begin` to `stop`,
    less `paused` (declared pauses); CPU seconds read at both ends (None where not read)."""

    step: int
    begin: float
    stop: float
    paused: float
    cpu_begin: float | None
    cpu_stop: float | None


def windows(events: list[list]) -> list[StepWindow]:
    """A rank's stamped events ([stamp, event, step, cpu]) as its steps' windows."""
    out, begin, paused, pause_at, stop = [], None, 0.0, None, None
    for stamp, event, step, cpu in events:
        if event == "begin":
            begin, paused, pause_at, stop = (stamp, cpu), 0.0, None, None
        elif event == "pause" and begin:
            pause_at, stop = stamp, (stamp, cpu)
        elif event == "resume" and pause_at is not None:
            paused += stamp - pause_at
            pause_at, stop = None, None
        elif event == "end" and begin and isinstance(step, int):
            stop = stop or (stamp, cpu)
            out.append(StepWindow(step, begin[0], stop[0], paused, begin[1], stop[1]))
            begin = None
    return out


def load_stamps(run_dir: Path) -> dict | None:
    """The watcher's stamps of a finished run; read before the plugin's `fbench_read_report`,
    which could change the run folder."""
    path = Path(run_dir) / STAMPS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def checks(stamps: dict | None, warmup: int, claimed: dict[int, dict[int, float]], cpu: bool) -> list:
    """The clock, pauses and (on CPU) cpu checks of a finished run from its `load_stamps`.
    `claimed`: {rank: {step: seconds}} from the worker's metrics. No clock lines at all:
    `clock` is unverified (a claim not made)."""
    from framework_bench.measure.verify import Check  # here: the node-side watcher runs with no host dependencies

    if stamps is None:
        return [Check(name="clock", status="unverified", detail=f"unverified: the host kept no stamps ({STAMPS_FILE})")]
    per_rank = {int(r): [w for w in windows(ev) if w.step > warmup] for r, ev in stamps["ranks"].items()}
    per_rank = {r: ws for r, ws in per_rank.items() if ws}
    if not per_rank:
        return [Check(name="clock", status="unverified",
                      detail="unverified: the worker wrote no clock lines for its measured steps (no SDK StepTimer)")]
    worst = {}
    for rank, ws in per_rank.items():
        span = ws[-1].stop - ws[0].begin
        pauses = sum(w.paused for w in ws)
        own = claimed.get(rank, {})
        told = sum(own.get(w.step, 0.0) for w in ws)
        clock = dict(rank=rank, claimed_seconds=round(told, 6), observed_seconds=round(span, 6),
                     declared_pause_seconds=round(pauses, 6), steps=len(ws),
                     share=round(told / (span - pauses), 4) if span > pauses else None)
        if worst.get("clock") is None or (clock["share"] or 1e9) < (worst["clock"]["share"] or 1e9):
            worst["clock"] = clock
        step_pause = max(ws, key=lambda w: w.paused / max(w.stop - w.begin, 1e-9))
        pause = dict(rank=rank, step=step_pause.step, paused_seconds=round(step_pause.paused, 6),
                     step_seconds=round(step_pause.stop - step_pause.begin, 6),
                     share=round(step_pause.paused / max(step_pause.stop - step_pause.begin, 1e-9), 4))
        if worst.get("pauses") is None or pause["share"] > worst["pauses"]["share"]:
            worst["pauses"] = pause
        if cpu and ws[0].cpu_begin is not None and ws[-1].cpu_stop is not None:
            used = ws[-1].cpu_stop - ws[0].cpu_begin
            share = dict(rank=rank, cpu_and_wait_seconds=round(used, 3), wall_seconds=round(span, 3),
                         share=round(used / span, 4) if span > 0 else None,
                         measurable=span >= MIN_CPU_SPAN_SECONDS)
            if worst.get("cpu") is None or (share["share"] or 0) < (worst["cpu"]["share"] or 0):
                worst["cpu"] = share
    out = []
    c = worst["clock"]
    c |= nvml_figures(stamps.get("nvml"), min(ws[0].begin for ws in per_rank.values()),
                      max(ws[-1].stop for ws in per_rank.values()))
    detail = (f"rank {c['rank']}: claimed {c['claimed_seconds']:.3f} s over {c['steps']} measured steps, the host saw "
              f"{c['observed_seconds']:.3f} s less {c['declared_pause_seconds']:.3f} s of declared pauses")
    if "nvml" in c or "nvml_busy_percent" in c:  # recorded, never judged
        detail += "; NVML " + (c.get("nvml") or f"{c['nvml_busy_percent']:g}% busy over {c['nvml_samples']} samples, "
                                                f"{c['nvml_energy_joules']} J")
    # No time seen at all (every line in one read) is no claim beyond the time that passed.
    ok = c["claimed_seconds"] >= MIN_CLAIMED_SHARE * (c["observed_seconds"] - c["declared_pause_seconds"])
    out.append(Check(name="clock", status="pass" if ok else "fail", figures=c,
                     detail=detail if ok else f"{detail}: under {MIN_CLAIMED_SHARE:.0%} of the time that passed"))
    p = worst["pauses"]
    detail = f"rank {p['rank']} step {p['step']}: {p['paused_seconds']:.3f} s paused in a {p['step_seconds']:.3f} s step"
    ok = p["share"] <= MAX_PAUSE_SHARE
    out.append(Check(name="pauses", status="pass" if ok else "fail", figures=p,
                     detail=detail if ok else f"{detail}: above {MAX_PAUSE_SHARE:.0%} of the step, with the rows "
                                              "packed beforehand there is nothing to wait for"))
    u = worst.get("cpu")
    if cpu and u is not None and u["measurable"]:
        detail = (f"rank {u['rank']}: {u['cpu_and_wait_seconds']:.2f} s on or waiting for a CPU in "
                  f"{u['wall_seconds']:.2f} s of measured steps")
        ok = u["share"] >= MIN_CPU_SHARE
        out.append(Check(name="cpu", status="pass" if ok else "fail", figures=u,
                         detail=detail if ok else f"{detail}: under {MIN_CPU_SHARE:.0%}, the worker waited "
                                                  "through its steps"))
    elif cpu:  # a figure the host could not read is no claim of the worker's: said, never judged
        out[0].detail += "; CPU share unavailable: " + ("no /proc to read" if u is None else
                                                        f"{u['wall_seconds']:.3f} s of steps is too short to read")
    return out


def _watch_until_terminated(run_dir: str, warmup: str, steps: str, ranks: str, gpus: str | None = None) -> None:
    """The watcher on a SLURM job's first node: its projection seed is its own draw (no run
    there is judged against a reference's projection)."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    reveal = Reveal(after_step=int(steps), ranks=int(ranks), seed=secrets.randbits(31))
    with Watcher(Path(run_dir), int(warmup), cpu=False, gpus=gpus, reveal=reveal):
        while not stop.wait(0.5):
            pass


if __name__ == "__main__":
    _watch_until_terminated(*sys.argv[1:6])
