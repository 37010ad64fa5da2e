"""`fbench bisect`: the first release of a distribution past a slowdown, by halving the releases
between one known good and one known bad. Each probe is one campaign of the backend at the good
release beside the backend at the probed one (`plugins/pins.py`), in the same rounds, beside the
same reference, each run refereed and stored as in any compare; the probed release is bad when
its TGS over the good one's is below 1 with 95 % confidence and by more than the threshold."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable

from packaging.version import InvalidVersion, Version
from pydantic import BaseModel, Field

from framework_bench.measure import statistics
from framework_bench.measure.statistics import Ratio, Trial
from framework_bench.plugins import pins, registry
from framework_bench.run.campaign import Events, Request, campaign
from framework_bench.run.preflight import Refused


class Probe(BaseModel):
    version: str
    ratio: float | None = Field(None, description="its TGS over the good release's (the median of paired rounds)")
    low: float | None = None
    high: float | None = None
    bad: bool = False
    why: str = ""
    interrupted: bool = False


class Bisection(BaseModel):
    package: str
    good: str
    bad: str
    releases: list[str] = Field(description="the releases between good and bad, both included, oldest first")
    listed: bool = Field(description="whether the releases came from the index (else only the two given)")
    probes: list[Probe] = Field(default_factory=list)
    first_bad: str | None = None
    interrupted: bool = False


def releases(package: str, good: str, bad: str) -> list[str] | None:
    """The final releases of `package` the index offers from `good` to `bad`, oldest first (what
    `pip index versions` lists, through the index pip is configured with); None where pip cannot
    list them (offline, no such package)."""
    out = subprocess.run([sys.executable, "-m", "pip", "index", "versions", package, "--disable-pip-version-check"],
                         capture_output=True, text=True)
    listed = re.search(r"^Available versions: (.+)$", out.stdout, re.MULTILINE)
    if out.returncode or not listed:
        return None
    low, high = Version(good), Version(bad)
    found = []
    for text in listed.group(1).split(", "):
        try:
            v = Version(text.strip())
        except InvalidVersion:
            continue
        if low <= v <= high and not v.is_prerelease:
            found.append(v)
    return [str(v) for v in sorted(found)]


def slower(r: Ratio, threshold: float) -> bool:
    """The probed release is slower than the good one past `threshold` percent: its interval
    leaves 1 out below, and the ratio is that far under 1."""
    return r.high is not None and r.high < 1 and (1 - r.ratio) * 100 > threshold


def bisect(backend: str, package: str | None, good: str, bad: str, request: Request, threshold: float = 5.0,
           events: Events | None = None, on_probe: Callable[[Probe], None] = lambda p: None) -> Bisection:
    """The first release after `good`, up to `bad`, of `package` (None: the backend's framework
    package) whose probe is slower past `threshold` percent; `request` gives the probes' scenario
    and options (repeat, seed, store...), its backends replaced. `preflight.Refused` where
    `good` and `bad` are no releases, the first not the earlier."""
    try:
        if Version(good) >= Version(bad):
            raise Refused(f"--good {good} must be an earlier release than --bad {bad}")
    except InvalidVersion as e:
        raise Refused(str(e)) from None
    package = package or registry.get(backend).info.env.framework_package
    listed = releases(package, good, bad)
    found = Bisection(package=package, good=good, bad=bad, releases=sorted({*(listed or []), good, bad}, key=Version),
                      listed=listed is not None)

    def probe(version: str) -> Probe:
        names = [registry.canonical(f"{backend}{pins.SEP}{package}=={v}") for v in (good, version)]
        outcome = campaign(request.model_copy(update={"backends": names}), events)
        trials = [Trial.from_record(r.model_dump(mode="json")) for r in outcome.results if r.backend in names]
        ratio = next(iter(statistics.pairs(trials, names[0])), None)  # the probed over the good: the one pair
        p = Probe(version=version, interrupted=outcome.interrupted)
        if ratio is None:
            p.why = "no counted trial of one side: not judged, taken as good"
        else:
            p.ratio, p.low, p.high, p.bad = ratio.ratio, ratio.low, ratio.high, slower(ratio, threshold)
        on_probe(p)
        return p

    search(found, probe)
    return found


def search(found: Bisection, probe: Callable[[str], Probe]) -> None:
    """Halve `found.releases` (the first good, the last bad) down to the first bad one, probing the
    last first: where it is not slower there is nothing to find. Each probe is kept in `found`; an
    interrupted one ends the search where it stands."""
    lo, hi = 0, len(found.releases) - 1
    at = hi
    while True:
        p = probe(found.releases[at])
        found.probes.append(p)
        if p.interrupted or (at == len(found.releases) - 1 and not p.bad):
            found.interrupted = p.interrupted
            return
        lo, hi = (lo, at) if p.bad else (at, hi)
        if hi - lo <= 1:
            found.first_bad = found.releases[hi]
            return
        at = (lo + hi) // 2
