"""The `machine` check: how much of the machine other processes took while a run's measured steps
ran. The watcher stamps the whole machine's busy CPU time beside the run's own process tree's at
every step's ends (`clock.py`); the machine's busy time less the run's, over the CPUs times the
steps' seconds, is the share other work kept. Above `clock_checks.WARMUP_OTHERS_SHARE` the run is
*disturbed*: its figures are the machine's as much as the framework's. A flag, never a reason to
call the run invalid (the framework did nothing wrong); the answer says how many runs were
disturbed and crowns no framework on one. GPU runs: the host reads no device utilisation of
other processes yet, so they are not judged."""

from __future__ import annotations

from framework_bench.measure.clock_checks import WARMUP_OTHERS_SHARE, others_share, windows
from framework_bench.measure.verify import Check

NAME = "machine"
# The share of the machine's CPUs other processes kept busy over the measured steps above which
# a run is disturbed: the bound that already stops the warm-up check beside other work.
DISTURBED_SHARE = WARMUP_OTHERS_SHARE


def check(stamps: dict | None, warmup: int) -> Check | None:
    """The share other processes took over rank 0's measured steps (the tree read at each stamp is
    the whole run's), or None where the watcher read no machine time (GPU runs, older stamps)."""
    cpus = (stamps or {}).get("cpus")
    events = ((stamps or {}).get("ranks") or {}).get("0")
    if not cpus or not events:
        return None
    measured = [w for w in windows(events) if w.step > warmup]
    if (others := others_share(measured, cpus)) is None:
        return None
    figures = {"others_share": round(others, 3), "cpus": cpus, "steps": len(measured)}
    said = f"other processes kept {others:.0%} of the machine's {cpus} CPUs busy during the measured steps"
    if others > DISTURBED_SHARE:
        return Check(name=NAME, status="fail", figures=figures,
                     detail=f"disturbed: {said} (over {DISTURBED_SHARE:.0%}): its figures are the machine's as much "
                            "as the framework's; rerun on a quiet machine, or --repeat to name the disturbed rounds")
    return Check(name=NAME, status="pass", figures=figures, detail=said)


def disturbed(record: dict) -> bool:
    """Whether a run (a stored row or a `RunResult` dump) failed the `machine` check."""
    return said(record) is not None


def said(record: dict) -> str | None:
    """A disturbed run's `machine` detail ("disturbed: other processes kept ..."), else None."""
    return next((c["detail"] for c in record.get("checks") or [] if c["name"] == NAME and c["status"] == "fail"), None)
