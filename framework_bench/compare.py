"""`fbench compare`: every chosen backend on every chosen scenario, on one packed stream each.

Runs are sequential (they would compete for the same devices). Each finished run is
stored at once, so Ctrl-C or a crash loses only the run in flight.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from pathlib import Path

from framework_bench import launch, plugins, runner, scenario as scenarios_
from framework_bench.metrics import RunResult
from framework_bench.scenario import Scenario, ScenarioError


def expand(patterns: list[str]) -> list[Scenario]:
    """Scenario names, globs over the names in scenarios/ (`tiny_cpu*`), or file paths; in order, no repeats."""
    names = [p.stem for p in scenarios_.scenario_paths()]
    chosen: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            hits = fnmatch.filter(names, pattern)
            if not hits:
                raise ScenarioError(f"no scenario matches {pattern!r}")
            chosen += hits
        else:
            chosen.append(pattern)
    seen: dict[str, Scenario] = {}
    for name in chosen:
        s = scenarios_.load(name)
        seen.setdefault(s.name, s)
    return sorted(seen.values(), key=lambda s: (s.model.preset or "", s.context_length))


# The no-framework reference (a plain PyTorch loop): other backends' TGS is shown as a share of its.
REFERENCE_BACKEND = "torch"


def percent_of_reference(rows: list[tuple[str, str, str, float | None]]) -> dict[tuple[str, str], float]:
    """TGS as % of the reference backend's on the same scenario, by (scenario, backend), from
    (scenario, backend, status, tgs) rows; only rows that are `ok` beside an `ok` reference row.
    100 % - x is the framework's overhead (or, above 100 %, what it gains) over the plain loop."""
    ref = {scn: tgs for scn, backend, status, tgs in rows
           if backend == REFERENCE_BACKEND and status == "ok" and tgs}
    return {(scn, backend): 100.0 * tgs / ref[scn] for scn, backend, status, tgs in rows
            if scn in ref and status == "ok" and tgs is not None}


class Interrupted(Exception):
    """Ctrl-C during a compare: the results finished so far are kept."""


def compare(
    scenarios: list[Scenario],
    backend_names: list[str],
    *,
    timeout: float | None = None,
    on_result: Callable[[RunResult, Scenario], None] = lambda r, s: None,
    on_start: Callable[[str, Scenario], None] = lambda b, s: None,
    on_step: runner.StepCallback = lambda done, total, secs: None,
    root: Path | None = None,
    launcher: launch.Launcher | None = None,
    force: bool = False,
) -> list[RunResult]:
    found = plugins.backends()
    missing = [b for b in backend_names if b not in found]
    broken = [f"the backend {b!r} is installed but broken: {plugins.load_errors[b]}" for b in missing
              if b in plugins.load_errors]
    if broken:
        raise plugins.UnknownBackend("\n".join(broken))
    if missing:
        raise plugins.UnknownBackend(f"no backend named {', '.join(missing)}; installed: {', '.join(found)}")
    results: list[RunResult] = []
    for s in scenarios:
        for name in backend_names:
            on_start(name, s)
            # run_one packs only when the backend can run the scenario; the packed data is
            # cached by its inputs, so the second backend reads the very same files.
            result = runner.run_one(name, s, timeout=timeout, on_step=on_step, root=root, launcher=launcher,
                                    force=force)
            on_result(result, s)
            results.append(result)
            if result.status == "interrupted":
                raise Interrupted(results)
    return results
