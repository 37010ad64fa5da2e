"""`fbench history`: every stored compare as a point of its series, one series per scenario,
backend and machine, and where each series' speed changed (`measure/change_points.py`), named
with the versions and compares either side. A scenario whose definition changed is a new series:
its TGS measures another run. Runs outside any compare are each a point of their own."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from packaging.version import InvalidVersion, Version

from framework_bench.measure import change_points, statistics
from framework_bench.measure.statistics import Trial
from framework_bench.present.chart_style import hardware
from framework_bench.present.verdict import definition

ORDERS = ("date", "version")


@dataclass(frozen=True)
class Point:
    """One compare's trials of one backend on one scenario: their median TGS and interval."""

    compare: str
    date: str
    versions: dict[str, str]
    median: float
    low: float | None
    high: float | None
    trials: int


@dataclass
class Series:
    scenario: str
    backend: str
    machine: str
    points: list[Point]
    changes: list[change_points.Change] | None = field(default=None)  # None: too few points to tell
    left_out: int = 0  # compares of this series with no counted trial (none ended ok)

    @property
    def name(self) -> str:
        return f"{self.scenario} · {self.backend} · {self.machine}"


def _versions(row: dict) -> dict[str, str]:
    versions = dict(((row.get("manifest") or {}).get("backend_env") or {}).get("versions") or {})
    if row.get("framework_version"):
        versions = {row["backend"]: row["framework_version"], **versions}
    return versions


def _parsed(v: str | None) -> Version:
    try:
        return Version(v or "0")
    except InvalidVersion:
        return Version("0")


def _by_version(points: list[Point], backend: str) -> list[Point]:
    """The framework's version first, then each other package's, then the date."""
    names = sorted({k for p in points for k in p.versions} - {backend})
    return sorted(points, key=lambda p: (*(_parsed(p.versions.get(k)) for k in (backend, *names)), p.date))


def series(rows: list[dict], by: str = "date") -> list[Series]:
    """The stored runs (`ResultStore.list`, oldest first) as series, each point a compare, in the
    order of its date or (`by="version"`) its backend's version; each searched for changes."""
    groups: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (r["scenario"], r["backend"], hardware([r]), definition(r["scenario_json"]))
        groups[key][r.get("compare_id") or f"run {r['id']}"].append(r)
    out, seen = [], defaultdict(int)
    for (scenario, backend, machine, _), compares in groups.items():
        seen[scenario, backend, machine] += 1
        label = scenario if seen[scenario, backend, machine] == 1 else f"{scenario} (definition {seen[scenario, backend, machine]})"
        s = Series(label, backend, machine, [])
        for compare, runs in compares.items():
            summary = statistics.summarise(Trial.from_record(r) for r in runs)[scenario, backend]
            if summary.median is None:
                s.left_out += 1
                continue
            s.points.append(Point(compare, runs[0]["created_at"][:10], _versions(runs[-1]), summary.median,
                                  summary.low, summary.high, summary.trials))
        if by == "version":
            s.points = _by_version(s.points, backend)
        s.changes = change_points.find([p.median for p in s.points])
        out.append(s)
    return out


def _moved(before: Point, after: Point) -> str:
    changed = [f"{k} {before.versions.get(k, '-')} → {after.versions.get(k, '-')}"
               for k in dict.fromkeys([*before.versions, *after.versions]) if before.versions.get(k) != after.versions.get(k)]
    return ", ".join(changed) if changed else "no version changed"


def _interval(p: Point) -> str:
    return f" ({p.low:,.0f}–{p.high:,.0f})" if p.low is not None else ""


def change_line(s: Series, c: change_points.Change) -> str:
    before, after = s.points[c.at - 1], s.points[c.at]
    word = "slower" if c.ratio < 1 else "faster"
    return (f"{abs(1 - c.ratio):.1%} {word} from compare {after.compare} ({after.date}) on: {_moved(before, after)} "
            f"since compare {before.compare} ({before.date}); median TGS {before.median:,.0f} → "
            f"{after.median:,.0f}, p {c.p:.3f} (permutation test of the best split, {change_points.PERMUTATIONS} shuffles)")


def lines(all_series: list[Series]) -> list[str]:
    """Per series: its name, each point (date, compare, versions, median TGS with its interval),
    then its change points, "no change" or "insufficient data"."""
    out = []
    for s in all_series:
        out.append(f"{s.name}: {len(s.points)} compare(s)" + (f", {s.left_out} with no run ok left out" if s.left_out else ""))
        for p in s.points:
            versions = " ".join(f"{k} {v}" for k, v in p.versions.items())
            out.append(f"  {p.date}  {p.compare}  {p.median:,.0f}{_interval(p)} TGS, {p.trials} trial(s)  {versions}")
        if s.changes is None:
            out.append(f"  insufficient data: {len(s.points)} point(s); a change needs {change_points.MIN_POINTS} "
                       "to be told from chance")
        elif not s.changes:
            out.append(f"  no change point (none at p < {change_points.ALPHA} with a step of "
                       f"{change_points.MIN_STEP:.0%} or more)")
        out += [f"  {change_line(s, c)}" for c in s.changes or []]
    return out


def data(all_series: list[Series]) -> dict:
    """The history as data (`--json`)."""
    return {"series": [{
        "scenario": s.scenario, "backend": s.backend, "machine": s.machine, "left_out": s.left_out,
        "points": [vars(p) for p in s.points],
        "insufficient_data": s.changes is None,
        "changes": [{"at": c.at, "compare": s.points[c.at].compare, "before": s.points[c.at - 1].compare,
                     "ratio": c.ratio, "p": c.p, "sentence": change_line(s, c)} for c in s.changes or []],
    } for s in all_series]}


def changed(all_series: list[Series]) -> list[str]:
    """Each series with a change point, with its latest change (`--fail-on-change`)."""
    return [f"{s.name}: {change_line(s, s.changes[-1])}" for s in all_series if s.changes]
