"""The `median_step` check: work moved out of the steps that make the figure. TGS is the median
measured step's, so a worker lightens it by lightening at least half of the measured steps (a
median of n steps moves once ceil(n/2) of them are lighter). The work moved out of a step lands
in the time before the next step begins, except the last step's, after the host's last stamp: so
at least ceil(n/2) - 1 of the gaps between measured steps hold it. The `gaps` check sees that
work diluted over every step's span (the update of every other step moved: under its share); this
one takes the (ceil(n/2) - 1)-th largest gap, which the moved work fills and an honest run's odd
long gap (a late stamp, a framework's hook now and then) does not, less the least gap, against the
median step. The least gap is what every step pays between steps (HF Trainer's logging and next
batch: a few % of a step on CPU, uneven over two processes); work moved out of the steps leaves it
clean unless it fills every gap, which lightens every step alike and is `gaps`' to bound.

Judged on the run's own CPU work where the host read it (CPU runs: the process tree's run time at
each stamp, which load on a shared machine does not add to) and on wall time, a run failing only
where both exceed the bound: work moved out of the steps takes both, while an honest worker
descheduled between its steps shows wall time only, and a run time read a scheduler tick late
(a thread's is brought up to date as it is scheduled) CPU time only. Where no CPU time was read
(GPU runs, a run on several SLURM nodes) on wall time. On the rank with the least, as `gaps`:
work moved out of the steps shows on every rank. What the bounds were set from: docs/calibration.md.
"""

from __future__ import annotations

import math
import statistics

from framework_bench.measure.clock_checks import MAX_GAP_SHARE, STAMP_JITTER_SECONDS, StepWindow, windows
from framework_bench.measure.verify import Check

# The gap at most the share of the median step that `gaps` allows of the span, and a slack for
# the reading and the SDK's own bookkeeping between steps (rows and losses written once the clock
# stopped): in CPU work, in wall time where the CPU work is judged beside it, and the stamps'
# latest lateness (`STAMP_JITTER_SECONDS`) where wall time is judged alone. The honest figures and
# the lies': docs/calibration.md.
MAX_MEDIAN_GAP_SHARE = MAX_GAP_SHARE
MEDIAN_GAP_CPU_SLACK_SECONDS = 0.010
MEDIAN_GAP_WALL_SLACK_SECONDS = 0.005


def held(steps: int) -> int:
    """How many of the gaps between `steps` measured steps hold the work moved out of the steps
    that make their median: ceil(steps / 2) lightened, the last one's work after the last stamp."""
    return max(1, math.ceil(steps / 2) - 1)


def _gap(windows_: list[float], gaps: list[float], slack: float) -> dict:
    """The `held`-th largest gap less the least (where there is another) against the median window:
    seconds, the share the difference is of the window, and `over` the bound."""
    ordered, nth = sorted(gaps, reverse=True), held(len(windows_))
    window, gap = statistics.median(windows_), ordered[nth - 1]
    least = ordered[-1] if len(ordered) > nth else 0.0
    return {"median_step": round(window, 6), "gap": round(gap, 6), "least_gap": round(least, 6),
            "share": round((gap - least) / window, 4) if window > 0 else None,
            "over": round(gap - least - MAX_MEDIAN_GAP_SHARE * window - slack, 6)}


def _rank(rank: int, ws: list[StepWindow]) -> dict:
    read = all(w.ran is not None for w in ws)
    wall = _gap([w.seen for w in ws], [b.begin - a.stop for a, b in zip(ws, ws[1:])],
                MEDIAN_GAP_WALL_SLACK_SECONDS if read else STAMP_JITTER_SECONDS)
    out = {"rank": rank, "steps": len(ws), "gaps_held": held(len(ws)), **{f"wall_{k}": v for k, v in wall.items()},
           "over": wall["over"]}
    if read:
        cpu = _gap([w.ran for w in ws], [b.ran_begin - a.ran_stop for a, b in zip(ws, ws[1:])],
                   MEDIAN_GAP_CPU_SLACK_SECONDS)
        out |= {f"cpu_{k}": v for k, v in cpu.items()} | {"over": min(wall["over"], cpu["over"])}
    return out


def median_step_check(stamps: dict | None, warmup: int) -> Check | None:
    """The `median_step` check of a finished run from its stamps (`clock_checks.load_stamps`);
    None without stamps or with fewer than two measured steps on a rank (the clock check says why)."""
    if stamps is None:
        return None
    ranks = {int(r): [w for w in windows(ev) if w.step > warmup] for r, ev in (stamps.get("ranks") or {}).items()}
    if not ranks or any(len(ws) < 2 for ws in ranks.values()):
        return None
    f = min((_rank(rank, ws) for rank, ws in sorted(ranks.items())), key=lambda r: r["over"])
    nth = "the largest gap" if f["gaps_held"] == 1 else f"gap {f['gaps_held']} by size"
    detail = (f"rank {f['rank']}: {nth} between its {f['steps']} measured steps {f['wall_gap'] * 1000:.1f} ms "
              f"(the least {f['wall_least_gap'] * 1000:.1f} ms), the median step {f['wall_median_step']:.3f} s")
    if "cpu_gap" in f:
        detail += (f"; in CPU work {f['cpu_gap'] * 1000:.1f} ms (the least {f['cpu_least_gap'] * 1000:.1f} ms) "
                   f"and {f['cpu_median_step']:.3f} s")
    if f["over"] <= 0:
        return Check(name="median_step", status="pass", figures=f, detail=detail)
    return Check(name="median_step", status="fail", figures=f, detail=(
        f"{detail}: more than the least gap by over {MAX_MEDIAN_GAP_SHARE:.0%} of the median step, beyond the "
        "reading's slack, in as many gaps as the steps that make the median leave their work in: work of those "
        "steps done between them"))
