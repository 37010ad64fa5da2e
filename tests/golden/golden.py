"""Golden files for the architecture refactor: what the CLI prints must not change.

Captured on the commit the refactor starts from (ffb5b33) with `python tests/golden/golden.py
--write`; `tests/test_golden.py` captures again and compares. Only what legitimately differs
between two runs is normalised: the checkout's path, run folder names (timestamp and pid),
rendezvous ports and the Python executable's folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FILES = Path(__file__).resolve().parent / "files"
FIXTURE_STORE = Path(__file__).resolve().parent / "fixture_results.sqlite"
CAPTURED_AT = "/work/main"  # the checkout the fixture store's runs were made in: its paths are stored
BACKENDS = "xtuner,llamafactory,torch"
# Each subcommand whose --help is pinned; the groups' own --help too.
COMMANDS = [
    [], ["scenarios"], ["show"], ["validate"], ["schema"], ["pack"], ["backends"],
    ["check-backend"], ["run"], ["compare"], ["plot"], ["report"],
    ["env"], ["env", "create"], ["env", "list"],
    ["results"], ["results", "list"], ["results", "show"], ["results", "export"],
    ["results", "collect"],
    ["device"], ["device", "bundle"], ["device", "check"], ["device", "estimate"],
]


def fbench() -> list[str]:
    return [str(Path(sys.executable).with_name("fbench"))]


def scenario_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


def _run(argv: list[str]) -> str:
    env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1"}
    env.pop("FBENCH_HOME", None)
    done = subprocess.run(fbench() + argv, capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=300)
    return f"exit {done.returncode}\n{done.stdout}"


def normalise(text: str) -> str:
    text = text.replace(str(ROOT), "<ROOT>").replace(CAPTURED_AT, "<ROOT>")
    text = re.sub(r"""\d{8}-\d{6}-[\w.-]+?-\d+(?=[/\\"'\s]|$)""", "<RUN>", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>", text)
    text = re.sub(r"(MASTER_PORT\"?:\s*\"?)\d+", r"\1<PORT>", text)
    return text


def _dry_run(scenario: str) -> str:
    """The dry-run records, each with the text files its plan wrote (job.json, configs)."""
    out = _run(["compare", "--dry-run", "--json", "--scenario", scenario, "--backends", BACKENDS])
    head, _, body = out.partition("\n")
    try:
        records = json.loads(body)
    except json.JSONDecodeError:
        return normalise(out)
    for record in records:
        written = {}
        for label, path in sorted((record.get("files") or {}).items()):
            p = Path(path)
            if p.is_file():
                written[label] = p.read_text(errors="replace").splitlines()
            elif p.is_dir():
                written[label] = sorted(c.name for c in p.iterdir())
        record["written"] = written
    return normalise(head + "\n" + json.dumps(records, indent=1, sort_keys=True))


def capture() -> dict[str, str]:
    jobs: dict[str, list] = {}
    for name in scenario_names():
        jobs[f"dry-run/{name}.json"] = [_dry_run, name]
        jobs[f"show/{name}.json"] = [lambda n: normalise(_run(["show", "--json", n])), name]
    for cmd in COMMANDS:
        key = "help/" + ("_".join(cmd) or "fbench") + ".txt"
        jobs[key] = [lambda c: normalise(_run(c + ["--help"])), cmd]
    with tempfile.TemporaryDirectory() as tmp:
        # a copy: the fixture stays as written, whatever a command does with the file it is given
        # (schema 6, before trials), so that its rows are read as old rows every time
        store = Path(shutil.copy(FIXTURE_STORE, tmp))
        jobs["results-export.json"] = [
            lambda _: normalise(_run(["results", "export", "--format", "json", "--db", str(store)])), None]
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {key: pool.submit(fn, arg) for key, (fn, arg) in jobs.items()}
        return {key: f.result() for key, f in futures.items()}


def write() -> None:
    for key, text in capture().items():
        path = FILES / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/golden/golden.py --write")
    write()
