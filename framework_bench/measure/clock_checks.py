"""The host's clock judged after the run: the watcher's stamps (`clock.py`), per rank, held
against the seconds the worker claims, step by step (the checks around the seeds' reveals:
`reveal_checks.py`).

- clock: the claimed seconds of the measured steps at least `MIN_CLAIMED_SHARE` of the observed
  span (first measured begin to the last measured step's stop) less the declared pauses; and
  each step's claim at least that share of its own window less its pauses, minus
  `STAMP_JITTER_SECONDS` (the figure is the median step: claims moved from one step to another
  would pass the sum). A claim above its window is recorded (`step_over`), not judged: it never
  flatters a figure, and the test suite's fake workers claim time they do not take;
- pauses: a step's declared pauses at most `MAX_PAUSE_SHARE` of the step: the rows are packed
  beforehand, there is nothing legitimate to wait for;
- gaps: the time between measured steps (where a loop fetches the next batch, a trainer runs its
  callbacks) at most `MAX_GAP_SHARE` of the span, and one stamp's `STAMP_JITTER_SECONDS`: work
  of the steps done there is not timed.
  Where the host read the workers' CPU run time (CPU runs), the share is the lesser of CPU work's
  and wall time's: the time an honest worker spends descheduled on a loaded machine is no work,
  and a run time read late carries a step's work into the gap after it; where it did not, of
  wall time. Judged on the rank with the least: work moved
  out of the steps shows on every rank, one rank's own delay on that rank only;
- warmup_time (a flag, every device): a warm-up step's wall time over `WARMUP_FLAG_RATIO` times
  the measured median: compile and autotune do that on GPU;
- warmup (CPU runs): a warm-up step's CPU work (run time, the wait for a CPU left out) at most
  `MAX_WARMUP_CPU_RATIO` times the measured median's, or `WARMUP_RUN_SHARE` times the run's
  steps, whichever is more: above, the warm-up holds training the measured steps left out; unless
  other processes kept `WARMUP_OTHERS_SHARE` of the machine's CPUs busy during that step, when it
  is `unverified` (not judged beside other work, never an honest framework called a liar);
- cpu (CPU runs): the process tree's CPU time in the median measured step, with the time its
  threads waited for a CPU (a shared machine starves honest workers too), at least
  `MIN_CPU_SHARE` of the step's wall time: a worker asleep through its steps computed them
  elsewhere.

cpu and warmup are the host's own measurements (`HOST_MEASURED`), not a worker's claims: where
/proc cannot be read, or the span is under `MIN_CPU_SPAN_SECONDS`, they are `unverified`, saying
why, which leaves a run `unverified`, never `invalid`. `FBENCH_UNCHECKED` (`verify.py`) leaves
checks out, for tests that show a lie is live; never for a figure anyone reads. What the bounds
were set from: docs/calibration.md.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from framework_bench.measure.clock import STAMPS_FILE
from framework_bench.measure.nvml import nvml_figures
from framework_bench.measure.verify import Check

MIN_CLAIMED_SHARE = 0.9
MAX_PAUSE_SHARE = 0.05
MIN_CPU_SHARE = 0.5
# The checks that are the host's own measurement, not a claim a worker makes.
HOST_MEASURED = ("cpu", "warmup")
MIN_CPU_SPAN_SECONDS = 0.2  # a shorter span says nothing: a thread's schedstat is brought up to date as it is scheduled
# How late a stamp may be, either end of a step: above the latest honest runs showed. Short steps
# need it (10 % of a 20 ms step is less than a late stamp); a larger one would let claims move
# between tiny_cpu's steps.
STAMP_JITTER_SECONDS = 0.015
# Between two measured steps the loop records the step and fetches the next batch, a trainer
# runs its callbacks: the bound sits between the most honest runs spent there and the least an
# optimizer step moved there took.
MAX_GAP_SHARE = 0.05
# A warm-up step's CPU work (run time, not the wait for a CPU) against the measured steps'
# median: a framework's first steps make its lazy set-up (allocator, thread pools), not
# several steps' training.
MAX_WARMUP_CPU_RATIO = 16.0
# ... or 1.5 times the run's steps, whichever is more: the whole run trained inside one warm-up
# step makes it at least the run's steps' work at the measured pace, while a burst of load on a
# shared machine, catching one honest step alone, can lift it near `MAX_WARMUP_CPU_RATIO`
# (spinning thread pools: the CPU time follows the wall time).
WARMUP_RUN_SHARE = 1.5
# ... unless other processes kept at least this share of the machine's CPUs busy during that
# warm-up step: then it is not judged (`unverified`). Beside other work an honest framework's first
# steps (thread pools, allocator, data loader) can cost more CPU than a whole run's training, so no
# bound on the work itself keeps both honest runs and that lie apart (docs/calibration.md).
WARMUP_OTHERS_SHARE = 0.25
WARMUP_FLAG_RATIO = 20.0  # a warm-up step's wall time over the measured median: shown (compile, autotune)


@dataclass
class StepWindow:
    """One step of one rank as the host stamped it: its clock ran from `begin` to `stop`,
    less `paused` (declared pauses); the process tree's CPU seconds (with the wait: `cpu_*`;
    run time only: `ran_*`) read at both ends, None where not read."""

    step: int
    begin: float
    stop: float
    paused: float
    cpu_begin: float | None
    cpu_stop: float | None
    ran_begin: float | None = None
    ran_stop: float | None = None
    busy_begin: float | None = None  # the machine's busy CPU seconds (every process), where read
    busy_stop: float | None = None

    @property
    def seen(self) -> float:
        """The seconds its clock ran as the host saw them."""
        return self.stop - self.begin - self.paused

    @property
    def ran(self) -> float | None:
        return None if self.ran_begin is None or self.ran_stop is None else self.ran_stop - self.ran_begin


def others_share(steps: list[StepWindow], cpus: int | None) -> float | None:
    """The share of the machine's CPUs other processes kept busy over `steps` (the machine's busy
    time less the run's own, over the CPUs times the steps' seconds), None where any is not read."""
    if not steps or not cpus or any(w.busy_begin is None or w.busy_stop is None or w.ran is None for w in steps):
        return None
    seconds = sum(w.seen for w in steps)
    if seconds <= 0:
        return None
    return max(0.0, sum(w.busy_stop - w.busy_begin - w.ran for w in steps) / (cpus * seconds))


def windows(events: list[list]) -> list[StepWindow]:
    """A rank's stamped events ([stamp, event, step, cpu and wait, cpu, machine busy]; runs
    stamped before the run time or the machine's was read lack the last ones) as its steps' windows. A pause not followed by a resume
    stops the step's clock (its `end` line may come later, once the framework logged the loss)."""
    out, begin, paused, pause_at, stop = [], None, 0.0, None, None
    for stamp, event, step, *cpu in events:
        cpu = (cpu + [None, None, None])[:3]
        if event == "begin":
            begin, paused, pause_at, stop = (stamp, *cpu), 0.0, None, None
        elif event == "pause" and begin:
            pause_at, stop = stamp, (stamp, *cpu)
        elif event == "resume" and pause_at is not None:
            paused += stamp - pause_at
            pause_at, stop = None, None
        elif event == "end" and begin and isinstance(step, int):
            stop = stop or (stamp, *cpu)
            out.append(StepWindow(step, begin[0], stop[0], paused, begin[1], stop[1], begin[2], stop[2],
                                  begin[3], stop[3]))
            begin = None
    return out


def host_seconds(stamps: dict | None) -> dict[tuple[int, int], float]:
    """{(rank, step): the seconds its clock ran as the host stamped them, less declared pauses}."""
    return {(int(rank), w.step): w.seen for rank, events in ((stamps or {}).get("ranks") or {}).items()
            for w in windows(events)}


def never_above_the_host(steps: list, stamps: dict | None) -> list:
    """The worker's step metrics, each step's seconds at least what the host saw of its window:
    the figures are then never better than the host's clock allows (a claim shaved within the
    clock check's `MIN_CLAIMED_SHARE` gains nothing), while a claim above its window stands (it
    never flatters; the test suite's fakes claim time they do not take). A step the host stamped
    no window of keeps its claim: the clock check says so."""
    seen = host_seconds(stamps)
    return [replace(m, seconds=seen[m.rank, m.step]) if seen.get((m.rank, m.step), 0.0) > m.seconds else m
            for m in steps]


def load_stamps(run_dir: Path) -> dict | None:
    """The watcher's stamps of a finished run; read before the plugin's `fbench_read_report`,
    which could change the run folder."""
    path = Path(run_dir) / STAMPS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _short_step(rank: int, ws: list[StepWindow], own: dict[int, float]) -> dict:
    """The step whose claim falls furthest under `MIN_CLAIMED_SHARE` of its own window (less
    pauses and the stamping jitter), and the largest claim over its window."""
    def margin(w: StepWindow) -> float:
        return own.get(w.step, 0.0) - (MIN_CLAIMED_SHARE * w.seen - STAMP_JITTER_SECONDS)
    w = min(ws, key=margin)
    return dict(rank=rank, step=w.step, claimed=round(own.get(w.step, 0.0), 6), seen=round(w.seen, 6),
                margin=round(margin(w), 6), over=round(max(own.get(v.step, 0.0) - v.seen for v in ws), 6))


def _warmup(rank: int, warm: list[StepWindow], measured: list[StepWindow], cpus: int | None = None) -> dict | None:
    """A rank's largest warm-up step against its measured median: wall time, and (where read)
    CPU run time and the share of the machine other work kept busy meanwhile."""
    if not warm:
        return None
    median = statistics.median(w.seen for w in measured)
    slow = max(warm, key=lambda w: w.seen)
    out = dict(rank=rank, step=slow.step, seconds=round(slow.seen, 6), measured_median_seconds=round(median, 6),
               ratio=round(slow.seen / median, 2) if median > 0 else None)
    ran = [w.ran for w in measured]
    if None not in ran and all(w.ran is not None for w in warm):
        busy = max(warm, key=lambda w: w.ran)
        out |= dict(cpu_step=busy.step, cpu_seconds=round(busy.ran, 4), measured_median_cpu_seconds=round(statistics.median(ran), 4),
                    cpu_limit_ratio=max(MAX_WARMUP_CPU_RATIO, WARMUP_RUN_SHARE * (len(warm) + len(measured))))
        if (others := others_share([busy], cpus)) is not None:
            out["others_share"] = round(others, 3)
    return out


def _projection(stamps: dict) -> dict:
    """Seconds from the seed's reveal to the worker's update claim in the run folder; empty
    where either was not seen."""
    reveal, claim = stamps.get("reveal") or {}, stamps.get("update_claim") or {}
    if "stamp" not in reveal or "stamp" not in claim:
        return {}
    return {"projection_seconds": round(claim["stamp"] - reveal["stamp"], 4)}


def checks(stamps: dict | None, warmup: int, claimed: dict[int, dict[int, float]], cpu: bool) -> list[Check]:
    """The clock, pauses, gaps, warmup_time and (on CPU) cpu and warmup checks of a finished run
    from its `load_stamps`. `claimed`: {rank: {step: seconds}} from the worker's metrics. No
    clock lines at all: `clock` is unverified (a claim not made)."""
    if stamps is None:
        return [Check(name="clock", status="unverified", detail=f"unverified: the host kept no stamps ({STAMPS_FILE})")]
    every = {int(r): windows(ev) for r, ev in stamps["ranks"].items()}
    per_rank = {r: [w for w in ws if w.step > warmup] for r, ws in every.items()}
    per_rank = {r: ws for r, ws in per_rank.items() if ws}
    if not per_rank:
        return [Check(name="clock", status="unverified",
                      detail="unverified: the worker wrote no clock lines for its measured steps (no SDK StepTimer)")]
    worst: dict[str, dict] = {}

    def keep(kind: str, figures: dict | None, key) -> None:
        if figures is not None and (worst.get(kind) is None or key(figures) > key(worst[kind])):
            worst[kind] = figures

    for rank, ws in per_rank.items():
        span = ws[-1].stop - ws[0].begin
        pauses = sum(w.paused for w in ws)
        own = claimed.get(rank, {})
        told = sum(own.get(w.step, 0.0) for w in ws)
        keep("clock", dict(rank=rank, claimed_seconds=round(told, 6), observed_seconds=round(span, 6),
                           declared_pause_seconds=round(pauses, 6), steps=len(ws),
                           share=round(told / (span - pauses), 4) if span > pauses else None,
                           median_step_seconds=round(statistics.median(w.seen for w in ws), 6)),
             lambda c: -(c["share"] or 1e9))
        keep("step", _short_step(rank, ws, own), lambda s: -s["margin"])
        step_pause = max(ws, key=lambda w: w.paused / max(w.stop - w.begin, 1e-9))
        keep("pauses", dict(rank=rank, step=step_pause.step, paused_seconds=round(step_pause.paused, 6),
                            step_seconds=round(step_pause.stop - step_pause.begin, 6),
                            share=round(step_pause.paused / max(step_pause.stop - step_pause.begin, 1e-9), 4)),
             lambda p: p["share"])
        keep("gaps", _gaps(rank, ws, span), lambda g: -g["over"])
        warm = _warmup(rank, [w for w in every[rank] if w.step <= warmup], ws, stamps.get("cpus"))
        keep("warmup", warm, lambda w: w.get("cpu_seconds", 0) / max(w.get("measured_median_cpu_seconds", 1), 1e-9))
        keep("warmup_time", warm, lambda w: w["ratio"] or 0)
        if cpu and (read := [w for w in ws if w.cpu_begin is not None and w.cpu_stop is not None and w.stop > w.begin]):
            ends_read = ws[0].cpu_begin is not None and ws[-1].cpu_stop is not None
            used = ws[-1].cpu_stop - ws[0].cpu_begin if ends_read else None
            # The median step's share, as TGS is the median step's: one step stalled on the disk
            # (a lazy import on a cold cache) is no lie, and a lie in most steps shows in the median.
            share = statistics.median((w.cpu_stop - w.cpu_begin) / (w.stop - w.begin) for w in read)
            keep("cpu", dict(rank=rank, cpu_and_wait_seconds=None if used is None else round(used, 3),
                             wall_seconds=round(span, 3), share=round(share, 4),
                             span_share=round(used / span, 4) if used is not None and span > 0 else None,
                             measurable=span >= MIN_CPU_SPAN_SECONDS), lambda u: -u["share"])
    return [_clock_check(stamps, per_rank, worst), _pauses_check(worst["pauses"]),
            _gaps_check(worst["gaps"])] + _warmup_checks(worst, cpu, _unread(stamps)) \
        + _cpu_checks(worst.get("cpu"), cpu, _unread(stamps))


def _unread(stamps: dict) -> str:
    """Why a CPU run's stamps carry no CPU time."""
    if stamps.get("cpu_read", True):
        return "no /proc to read"
    return "not read on a SLURM node (its watcher is no ancestor of the workers)"


def _clock_check(stamps: dict, per_rank: dict[int, list[StepWindow]], worst: dict) -> Check:
    c, s = worst["clock"], worst["step"]
    c |= nvml_figures(stamps.get("nvml"), min(ws[0].begin for ws in per_rank.values()),
                      max(ws[-1].stop for ws in per_rank.values()))
    c |= {f"step_{k}": v for k, v in s.items() if k != "rank"} | {"step_rank": s["rank"]} | _projection(stamps)
    detail = (f"rank {c['rank']}: claimed {c['claimed_seconds']:.3f} s over {c['steps']} measured steps, the host saw "
              f"{c['observed_seconds']:.3f} s less {c['declared_pause_seconds']:.3f} s of declared pauses")
    if "nvml" in c or "nvml_busy_percent" in c:  # recorded, never judged
        detail += "; NVML " + (c.get("nvml") or f"{c['nvml_busy_percent']:g}% busy over {c['nvml_samples']} samples, "
                                                f"{c['nvml_energy_joules']} J")
    # No time seen at all (every line in one read) is no claim beyond the time that passed.
    if c["claimed_seconds"] < MIN_CLAIMED_SHARE * (c["observed_seconds"] - c["declared_pause_seconds"]):
        return Check(name="clock", status="fail", figures=c, detail=f"{detail}: under {MIN_CLAIMED_SHARE:.0%} of the time that passed")
    if s["margin"] < 0:  # the figure is the median step: the sum alone lets claims move between steps
        return Check(name="clock", status="fail", figures=c, detail=(
            f"rank {s['rank']} step {s['step']}: claimed {s['claimed']:.3f} s, the host saw {s['seen']:.3f} s of it "
            f"(less pauses): under {MIN_CLAIMED_SHARE:.0%} of its own window, beyond "
            f"{STAMP_JITTER_SECONDS * 1000:.0f} ms of stamping jitter ({detail})"))
    return Check(name="clock", status="pass", figures=c, detail=detail)


def _pauses_check(p: dict) -> Check:
    detail = f"rank {p['rank']} step {p['step']}: {p['paused_seconds']:.3f} s paused in a {p['step_seconds']:.3f} s step"
    ok = p["share"] <= MAX_PAUSE_SHARE
    return Check(name="pauses", status="pass" if ok else "fail", figures=p,
                 detail=detail if ok else f"{detail}: above {MAX_PAUSE_SHARE:.0%} of the step, with the rows "
                                          "packed beforehand there is nothing to wait for")


def _gaps(rank: int, ws: list[StepWindow], span: float) -> dict:
    """A rank's time between measured steps, wall and (where read) CPU run time, their shares,
    and `over`: the seconds beyond the bound (`MAX_GAP_SHARE` of the span and one stamp's jitter)."""
    gaps = sum(b.begin - a.stop for a, b in zip(ws, ws[1:]))
    out = dict(rank=rank, gap_seconds=round(gaps, 6), observed_seconds=round(span, 6),
               wall_share=round(gaps / span, 4) if span > 0 else 0.0)
    over = [gaps - MAX_GAP_SHARE * span - STAMP_JITTER_SECONDS]
    ran = [(w.ran_begin, w.ran_stop) for w in ws]
    if all(b is not None and s is not None for b, s in ran) and ran[-1][1] > ran[0][0]:
        cpu_gaps, cpu = sum(b[0] - a[1] for a, b in zip(ran, ran[1:])), ran[-1][1] - ran[0][0]
        out |= dict(gap_cpu_seconds=round(cpu_gaps, 6), cpu_seconds=round(cpu, 6), cpu_share=round(cpu_gaps / cpu, 4))
        over.append(cpu_gaps - MAX_GAP_SHARE * cpu - STAMP_JITTER_SECONDS)
    # Work moved out of the steps shows in both; an honest worker's time descheduled shows in wall
    # time only, and a CPU reading a scheduler tick stale moves a step's work into a short gap.
    return out | {"share": min(out.get("cpu_share", out["wall_share"]), out["wall_share"]), "over": round(min(over), 6)}


def _gaps_check(g: dict) -> Check:
    detail = (f"rank {g['rank']}: {g['gap_seconds']:.3f} s between measured steps (one's end to the next one's "
              f"begin) in {g['observed_seconds']:.3f} s")
    if "cpu_share" in g:
        detail += f"; {g['gap_cpu_seconds']:.3f} s of CPU work there in {g['cpu_seconds']:.3f} s"
    ok = g["over"] <= 0
    return Check(name="gaps", status="pass" if ok else "fail", figures=g, detail=detail if ok else (
        f"{detail}: above {MAX_GAP_SHARE:.0%} and {STAMP_JITTER_SECONDS * 1000:.0f} ms of stamping jitter, work of "
        "the steps done between them"))


def _warmup_checks(worst: dict, cpu: bool, unread: str) -> list[Check]:
    """warmup_time (every device, a flag): a warm-up step's wall time far beyond the measured
    median; warmup (CPU runs): its CPU work so far beyond theirs that it holds their training."""
    t = worst.get("warmup_time")
    if t is None:
        return []
    detail = (f"rank {t['rank']} warm-up step {t['step']}: {t['seconds']:.3f} s, the measured median "
              f"{t['measured_median_seconds']:.3f} s")
    if t["ratio"] is None:  # no measured time to hold it against
        return []
    slow = t["ratio"] > WARMUP_FLAG_RATIO
    out = [Check(name="warmup_time", status="fail" if slow else "pass", figures=t, detail=detail if not slow else (
        f"{detail}: more than {WARMUP_FLAG_RATIO:g}x (a compile or autotune; or work of the measured steps)"))]
    w = worst.get("warmup")
    if not cpu:
        return out
    if w is None or "cpu_seconds" not in w:
        return out + [Check(name="warmup", status="unverified", detail=f"unverified: the CPU work {unread}")]
    figures = {k: w[k] for k in ("rank", "cpu_step", "cpu_seconds", "measured_median_cpu_seconds", "cpu_limit_ratio",
                                 "others_share") if k in w}
    detail = (f"rank {w['rank']} warm-up step {w['cpu_step']}: {w['cpu_seconds']:.3f} s of CPU work, the measured "
              f"median {w['measured_median_cpu_seconds']:.3f} s")
    if w["cpu_seconds"] <= w["cpu_limit_ratio"] * w["measured_median_cpu_seconds"]:
        return out + [Check(name="warmup", status="pass", figures=figures, detail=detail)]
    if w["cpu_seconds"] < MIN_CPU_SPAN_SECONDS:
        return out + [Check(name="warmup", status="unverified", figures=figures,
                            detail=f"unverified: {detail}, too little to read")]
    if w.get("others_share", 0.0) >= WARMUP_OTHERS_SHARE:
        return out + [Check(name="warmup", status="unverified", figures=figures, detail=(
            f"unverified: {detail}, more than {w['cpu_limit_ratio']:g}x, while other processes kept "
            f"{w['others_share']:.0%} of the machine's CPUs busy: not judged beside other work"))]
    return out + [Check(name="warmup", status="fail", figures=figures, detail=(
        f"{detail}: more than {w['cpu_limit_ratio']:g}x, the training done in the warm-up, the measured steps "
        "left lighter"))]


def _cpu_checks(u: dict | None, cpu: bool, unread: str) -> list[Check]:
    """On CPU: the cpu share, or `unverified` saying why it could not be read."""
    if not cpu:
        return []
    if u is None or not u["measurable"]:
        return [Check(name="cpu", status="unverified", figures=u or {}, detail="unverified: " + (
            unread if u is None else f"{u['wall_seconds']:.3f} s of measured steps is too short to read "
                                                 f"the CPU share (at least {MIN_CPU_SPAN_SECONDS:g} s)"))]
    whole = ("" if u["cpu_and_wait_seconds"] is None else
             f"{u['cpu_and_wait_seconds']:.2f} s on or waiting for a CPU in {u['wall_seconds']:.2f} s of measured steps, ")
    detail = f"rank {u['rank']}: {whole}the median step {u['share']:.0%} of its wall time"
    ok = u["share"] >= MIN_CPU_SHARE
    return [Check(name="cpu", status="pass" if ok else "fail", figures=u,
                  detail=detail if ok else f"{detail}: under {MIN_CPU_SHARE:.0%}, the worker waited through its steps")]
