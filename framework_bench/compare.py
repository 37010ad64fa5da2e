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
    """Scenario names, globs over the names in scenarios/ (`tiny_cpu*`), or file paths; in order, no
    repeats. Two different files with one name are refused: their runs would share one name."""
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
    seen: dict[str, tuple[Path, Scenario]] = {}
    for name in chosen:
        path = scenarios_.source_path(name)
        s = scenarios_.load(name)
        if s.name in seen and seen[s.name][0] != path:
            raise ScenarioError(f"two scenarios named {s.name!r}: {seen[s.name][0]} and {path}; rename one")
        seen.setdefault(s.name, (path, s))
    return sorted((s for _, s in seen.values()), key=lambda s: (s.model.preset or "", s.context_length))


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
