"""The report's "Settings in effect": the settings each backend really ran with, side by side,
the rows that differ between backends marked (speed-relevant ones first), and what matched
settings leave to the frameworks."""

from __future__ import annotations

from framework_bench.plugins import registry
from framework_bench.present.differences import NOT_ALIGNED, speed_relevant
from framework_bench.present.page import OTHER_MARK, SPEED_MARK, Block


def _settings_table(runs: list[dict], keys: set[str]) -> Block:
    """These settings side by side, a column per run; rows that differ between the runs are
    marked, speed-relevant ones first (highlighted in the HTML)."""
    speed = speed_relevant()
    table = []
    for key in sorted(keys):
        values = [r["settings"].get(key) for r in runs]
        # a key one backend does not record is unknown there ("-"), not a difference
        differs = all(key in r["settings"] for r in runs) and len({repr(v) for v in values}) > 1
        mark = (SPEED_MARK if key in speed else OTHER_MARK) if differs else ""
        table.append((0 if mark == SPEED_MARK else 1 if mark else 2, mark + key,
                      ["-" if v is None else str(v) for v in values]))
    table.sort(key=lambda t: t[0])
    return Block("table", header=["setting", *(r["backend"] for r in runs)], rows=[[k, *v] for _, k, v in table])


def _keys(runs: list[dict]) -> set[str]:
    return {k for r in runs for k in r["settings"]} - {"settings_mode"}


def _shared(by_scenario: dict[str, list[dict]]) -> tuple[set[str], list[dict]]:
    """The settings every scenario ran with alike: recorded in each scenario, and each backend
    with one value for it (or none) wherever it ran; with one run per backend standing for all of
    its scenarios in their table (a backend's first, by scenario name)."""
    def alike(key: str) -> bool:
        seen: dict[str, str | None] = {}
        for runs in by_scenario.values():
            for r in runs:
                value = repr(r["settings"][key]) if key in r["settings"] else None  # None: not recorded
                if seen.setdefault(r["backend"], value) != value:
                    return False
        return True
    common = set.intersection(*(_keys(runs) for runs in by_scenario.values()))
    columns: dict[str, dict] = {}
    for _, runs in sorted(by_scenario.items()):
        for r in runs:
            columns.setdefault(r["backend"], r)
    return {k for k in common if alike(k)}, list(columns.values())


def settings_sections(rows: list[dict]) -> list[Block]:
    """The settings each backend really ran with (one trial of each: `Points.rows`), side by side.
    One scenario: its table. Several: the settings they all share once, then per scenario only
    the ones that differ from scenario to scenario (five near-identical tables said nothing more)."""
    by_scenario: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("settings"):
            by_scenario.setdefault(r["scenario"], []).append(r)
    legend = (f"{SPEED_MARK.strip()} differs between backends and can move TGS, {OTHER_MARK.strip()} differs "
              "without a known effect on speed.")
    shared, columns = _shared(by_scenario) if len(by_scenario) > 1 else (set(), [])
    out = []
    if shared:
        out += [Block("p", f"Alike in every scenario ({', '.join(sorted(by_scenario))}; {modes(rows)} settings): "
                           f"{legend}"), _settings_table(columns, shared)]
    for name, runs in sorted(by_scenario.items()):
        rest = _keys(runs) - shared
        if not rest:
            out.append(Block("p", f"{name} ({modes(runs)} settings): every setting as in the table above."))
            continue
        what = "the settings not alike in every scenario, marked as above." if shared else legend
        out += [Block("p", f"{name} ({modes(runs)} settings): {what}"), _settings_table(runs, rest)]
    return out


def modes(rows: list[dict]) -> str:
    return "/".join(sorted({r.get("settings_mode") or "matched" for r in rows})) or "matched"


def not_aligned(rows: list[dict]) -> list[str]:
    """What matched settings leave to the frameworks: the common notes, then each installed
    backend's own (`BackendInfo.report_notes`) for the backends in `rows`."""
    installed = registry.backends()
    notes = list(NOT_ALIGNED)
    for name in sorted({r["backend"] for r in rows} & set(installed)):
        notes += installed[name].info.report_notes
    return list(dict.fromkeys(notes))  # a note two backends share (their engine's) once
