"""The host's checks of a run around the seeds it reveals (`clock.py`'s watcher writes the
initial seed once every rank is ready for its first step, and the update's seed once the last
measured step ended), and of the time from each reveal to what the worker did next:

- initial_reveal (`initial_reveal_check`): every rank said it was ready for its first step, the
  host revealed the initial seed of the trained weights then, the worker filled them from it
  (its initial-weights report says so) and no step began before. The time from the reveal to
  the last rank's first step (`first_window_seconds`, on CPU runs also the process tree's CPU
  work in it) is held against the reference's in `first_window_check`: training there shows;
  training before the reveal starts from weights nobody knew;
- warmup_update (`warmup_update_check`; a claim of plugin contract 5): when the warm-up ended,
  the worker projected its live weights with the seed the host revealed on seeing every rank end
  the last warm-up step (`framework_bench/worker/update.py`: report_at_warmup_end), and the
  projection was in the run folder before rank 0's first measured step began. The referee holds it
  against the reference's (`update.parity` of `update.WARMUP_UPDATE`): the reference's weights there
  are its warm-up's training alone, so training of later steps done inside the warm-up shows, and
  the projection cannot be made after the timed steps from weights trained again;
- losses_in_time (`losses_in_time_check`): when the last measured step ended (the seed's
  reveal), rank 0's loss records reached the step before it, and no record written by then was
  changed after. A step's loss needs the updates of the steps before it, so a worker that
  trained after its last timed step could not have written them in time. No tolerance: load
  cannot fail it;
- projection_delay (`projection_delay_check`, a flag): from the seed's reveal to the update
  claim, held against the reference's and the run's own median step. It no longer blocks: a
  burst of load on a shared machine stretches an honest projection past any fixed bound
  (docs/calibration.md), and losses_in_time judges what it was for.

The windows from a reveal are held against the reference's (`first_window_check`,
`projection_delay_check`: the referee calls them with both runs); what the bounds were set from:
docs/calibration.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from framework_bench.measure import update
from framework_bench.measure.clock_checks import WARMUP_OTHERS_SHARE, StepWindow, others_share, windows
from framework_bench.measure.verify import Check
from framework_bench.worker import initial_weights_host
from framework_bench.worker.losses import LOSSES_DIR

# The time from the seed's reveal to the worker's update claim against the reference's (the
# same projection of the same model), or against the run's own median measured step (the same
# moment's load on a machine shared with other work). Wall time: under load spinning thread
# pools made an honest projection's CPU time no steadier.
PROJECTION_DELAY_FACTOR, PROJECTION_DELAY_SLACK, PROJECTION_DELAY_STEPS = 4.0, 0.5, 6.0
# The time from the initial seed's reveal to the first step against the reference's: the same
# fill and report of the same model, then the framework's own way to its first step; or one of
# the reference's median measured steps, whichever is largest. A run trained before its first
# window shows there with its whole training. CPU work on CPU runs (load stretches wall time); over
# the bound while other processes kept `WARMUP_OTHERS_SHARE` of the machine busy, `unverified`, as
# `warmup` (a burst of load stretches one window: no bound keeps honest runs and the lie apart there).
FIRST_WINDOW_FACTOR, FIRST_WINDOW_SLACK, FIRST_WINDOW_STEPS = 4.0, 0.5, 1.0


def projection_delay_check(run, reference) -> Check | None:
    """The time from the seed's reveal to the run's update claim against the reference's
    (`RunResult`s; figures of their `clock` checks): at most `PROJECTION_DELAY_FACTOR` times the
    reference's, its figure plus `PROJECTION_DELAY_SLACK`, or `PROJECTION_DELAY_STEPS` of the
    run's own median measured step, whichever is largest. None where the run has no figure
    (its update check says why)."""
    mine, theirs = (next((c.figures for c in r.checks if c.name == "clock"), {}) for r in (run, reference))
    key, step = "projection_seconds", "median_step_seconds"
    if mine.get(key) is None:
        return None
    if theirs.get(key) is None:
        return Check(name="projection_delay", status="unverified",
                     detail=f"unverified: the reference {reference.backend}'s run kept no {key}")
    limit = max(PROJECTION_DELAY_FACTOR * theirs[key], theirs[key] + PROJECTION_DELAY_SLACK,
                PROJECTION_DELAY_STEPS * (mine.get(step) or 0.0))
    figures = {key: mine[key], f"reference_{key}": theirs[key], "limit": round(limit, 4)}
    detail = (f"{mine[key]:.3f} s from the seed's reveal to the update claim, the reference "
              f"{theirs[key]:.3f}, the run's median measured step {mine.get(step) or 0.0:.3f}")
    if mine[key] > limit:
        return Check(name="projection_delay", status="fail", figures=figures, detail=(
            f"{detail}: above {limit:.3f}, work done after the last measured step"))
    return Check(name="projection_delay", status="pass", figures=figures, detail=detail)


def initial_reveal_check(stamps: dict | None, run_dir: Path) -> Check | None:
    """Whether the trained weights started from the seed the host revealed once every rank was
    ready for its first step, with the time from that reveal to the last rank's first step
    (and on CPU runs the CPU work in it). None without stamps (the clock check says why)."""
    if stamps is None:
        return None
    reveal = stamps.get("initial_reveal") or {}
    if "stamp" not in reveal:
        return Check(name="initial_reveal", status="unverified", detail=(
            "unverified: the worker said no `ready` before its first step, so its trained weights started from a "
            "seed it knew from its start (initial_weights_worker.fill_revealed: plugin contract 4)"))
    firsts = []  # each rank's first step's begin: [stamp, event, step, cpu and wait, cpu, busy]
    for events in (stamps.get("ranks") or {}).values():
        if begins := [e for e in events if e[1] == "begin"]:
            firsts.append(begins[0])
    if not firsts:
        return None  # no step began: the clock check says so
    try:
        claimed = json.loads((Path(run_dir) / initial_weights_host.REPORT_FILE).read_text()).get("trained_seed")
    except (OSError, ValueError, AttributeError):
        return Check(name="initial_reveal", status="unverified",
                     detail="unverified: no initial-weights report says which seed the trained weights were filled from")
    if claimed != reveal["seed"]:
        return Check(name="initial_reveal", status="fail", detail=(
            f"the trained weights were filled from seed {claimed}, the host revealed {reveal['seed']}"))
    early = min(firsts, key=lambda e: e[0])
    if early[0] < reveal["stamp"]:
        return Check(name="initial_reveal", status="fail", detail=(
            f"a step began {reveal['stamp'] - early[0]:.3f} s before the host revealed the initial seed"))
    last = max(firsts, key=lambda e: e[0])
    figures = {"first_window_seconds": round(last[0] - reveal["stamp"], 4)}
    ran_stop, busy_stop = (last[4:6] + [None, None])[:2]
    window = StepWindow(0, reveal["stamp"], last[0], 0.0, None, None, reveal.get("cpu"), ran_stop, reveal.get("busy"),
                        busy_stop)  # the reveal to the first step, read as a step's window is
    if window.ran is not None:
        figures["first_window_cpu_seconds"] = round(window.ran, 4)
        if (others := others_share([window], stamps.get("cpus"))) is not None:
            figures["others_share"] = round(others, 3)
    return Check(name="initial_reveal", status="pass", figures=figures, detail=(
        f"seed {reveal['seed']} revealed when every rank was ready, {figures['first_window_seconds']:.3f} s "
        "before the last rank's first step"))


def first_window_check(run, reference) -> Check | None:
    """The time from the initial seed's reveal to the first step against the reference's
    (`RunResult`s; figures of their `initial_reveal` and `clock` checks): at most
    `FIRST_WINDOW_FACTOR` times the reference's, its figure plus `FIRST_WINDOW_SLACK`, or
    `FIRST_WINDOW_STEPS` of the reference's median measured step, whichever is largest; CPU
    work where both runs have it, else wall time. None where the run has no figure (its
    `initial_reveal` check says why)."""
    mine, theirs = (next((c.figures for c in r.checks if c.name == "initial_reveal"), {}) for r in (run, reference))
    if mine.get("first_window_seconds") is None:
        return None
    if theirs.get("first_window_seconds") is None:
        return Check(name="first_window", status="unverified",
                     detail=f"unverified: the reference {reference.backend}'s run kept no first_window_seconds")
    cpu = mine.get("first_window_cpu_seconds") is not None and theirs.get("first_window_cpu_seconds") is not None
    key, what = ("first_window_cpu_seconds", "s of CPU work") if cpu else ("first_window_seconds", "s")
    step = next((c.figures.get("median_step_seconds") for c in reference.checks if c.name == "clock"), None) or 0.0
    limit = max(FIRST_WINDOW_FACTOR * theirs[key], theirs[key] + FIRST_WINDOW_SLACK, FIRST_WINDOW_STEPS * step)
    out = {key: mine[key], f"reference_{key}": theirs[key], "reference_median_step_seconds": step,
           "limit": round(limit, 4)}
    detail = (f"{mine[key]:.3f} {what} from the initial seed's reveal to the first step, the reference "
              f"{theirs[key]:.3f}, its median measured step {step:.3f} s")
    if mine[key] <= limit:
        return Check(name="first_window", status="pass", figures=out, detail=detail)
    if (others := mine.get("others_share", 0.0)) >= WARMUP_OTHERS_SHARE:
        return Check(name="first_window", status="unverified", figures={**out, "others_share": others}, detail=(
            f"unverified: {detail}, above {limit:.3f}, while other processes kept {others:.0%} of the machine's CPUs "
            "busy: not judged beside other work"))
    return Check(name="first_window", status="fail", figures=out, detail=(
        f"{detail}: above {limit:.3f}, work done before the first step"))


def warmup_update_check(stamps: dict | None, run_dir: Path, adapters: bool = False, still: bool = False) -> Check | None:
    """The projection the worker made when the warm-up ended (`update.check` of
    `update.WARMUP_UPDATE`), and that it was in the run folder when rank 0's first measured step
    began (the watcher stamps it no later than the begin line written after it). None without
    stamps (the clock check says why) or warm-up steps. `still`: the warm-up ended before the first
    optimizer step did (micro-iterations), so the weights must be the initial ones."""
    if stamps is None or not stamps.get("warmup"):
        return None
    checked = update.check(run_dir, stamps, adapters, of=update.WARMUP_UPDATE, still=still)
    if checked.status != "pass":
        return checked
    warmup, reveal, claim = stamps["warmup"], stamps["warmup_reveal"], stamps.get("warmup_update_claim") or {}
    first = next((w.begin for w in windows((stamps.get("ranks") or {}).get("0", [])) if w.step == warmup + 1), None)
    if first is None:
        return None  # no measured step on rank 0: the clock check says so
    if "stamp" not in claim or claim["stamp"] > first:
        late = "after the run ended" if "stamp" not in claim else f"{claim['stamp'] - first:.3f} s after it began"
        return Check(name=checked.name, status="fail", figures=checked.figures, detail=(
            f"the projection of the weights when the warm-up ended appeared {late}: rank 0's first measured step "
            "began before the worker made it"))
    figures = {**checked.figures, "seconds_from_reveal": round(claim["stamp"] - reveal["stamp"], 4)}
    return Check(name=checked.name, status="pass", figures=figures, detail=(
        f"{checked.detail}, {figures['seconds_from_reveal']:.3f} s after it, before the first measured step"))


def _digest(path: Path, size: int) -> str | None:
    """sha256 of the first `size` bytes of `path` (None where it is gone or shorter)."""
    try:
        with path.open("rb") as fh:
            data = fh.read(size)
    except OSError:
        return None
    return hashlib.sha256(data).hexdigest() if len(data) == size else None


def losses_in_time_check(stamps: dict | None, run_dir: Path) -> Check | None:
    """Were the losses known when the host timed them? At the seed's reveal (every rank ended the
    last measured step) rank 0's records must reach the step before the last (the last one's are
    written just after its end), and every rank's records written by then must be there unchanged
    at the end. The reach is judged on rank 0 alone: under SLURM the watcher reads other nodes'
    files through the shared filesystem's cache, which may show them late; a rank's records are
    the same collective training, and every rank's are digested. None where the watcher noted
    nothing at a reveal (no reveal: the update check says why; stamps of an older host) or no
    records were written at all (the parity check says so)."""
    reveal = (stamps or {}).get("reveal") or {}
    if "losses" not in reveal or not any((Path(run_dir) / LOSSES_DIR).glob("rank*.jsonl")):
        return None
    last, seen = reveal["after_step"], reveal["losses"]
    reached = seen.get("0", {}).get("to_step", 0)
    figures = {"last_step": last, "rank0_to_step_at_reveal": reached}
    changed = [rank for rank, w in sorted(seen.items())
               if _digest(Path(run_dir) / LOSSES_DIR / f"rank{rank}.jsonl", w["bytes"]) != w["sha256"]]
    if changed:
        return Check(name="losses_in_time", status="fail", figures={**figures, "changed_ranks": ", ".join(changed)}, detail=(
            f"rank {', '.join(changed)}: loss records written before the seed's reveal (the last measured step's "
            "end) were changed after it"))
    if reached < last - 1:
        return Check(name="losses_in_time", status="fail", figures=figures, detail=(
            f"when the last measured step ({last}) ended, rank 0's loss records reached step {reached}: the losses "
            f"of steps {reached + 1}-{last - 1} were computed after the steps the host timed"))
    return Check(name="losses_in_time", status="pass", figures=figures, detail=(
        f"rank 0's loss records reached step {reached} of {last} when the last measured step ended, and every "
        "record written by then was kept as written"))
