"""Golden files: what the CLI prints, as a spec of its behaviour. For every bundled scenario, the
dry-run plans of three bundled backends (with every file each plan wrote) and `show --json`;
every command's `--help`; `results export` of a fixture store of old rows (schema 6, 0.1.0's).

`python tests/golden/golden.py --write` captures them; `tests/test_golden.py` captures again and
compares. The commands run in a state folder of their own whose envs link to the ones setup made
(`envs_home`), so nothing depends on where the checkout, the state folder or the envs lie: those
paths are written `<ROOT>`, `<HOME>` and `<ENVS>`, and run folder names (timestamp and pid) and
rendezvous ports are normalised. A difference is a regression or a deliberate change, re-captured
and named in the commit that makes it.
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
# Four rows of 0.1.0 (tiny_cpu), their paths under a checkout named /fixture.
FIXTURE_STORE = Path(__file__).resolve().parent / "fixture_results.sqlite"
BACKENDS = "xtuner,llamafactory,torch"
# Each subcommand whose --help is pinned; the groups' own --help too.
COMMANDS = [
    [], ["scenarios"], ["show"], ["validate"], ["schema"], ["pack"], ["backends"],
    ["check-backend"], ["run"], ["compare"], ["bisect"], ["plot"], ["report"], ["diff"], ["history"],
    ["env"], ["env", "create"], ["env", "list"],
    ["results"], ["results", "list"], ["results", "show"], ["results", "export"],
    ["results", "collect"],
    ["device"], ["device", "bundle"], ["device", "check"], ["device", "estimate"],
]


def fbench() -> list[str]:
    return [str(Path(sys.executable).with_name("fbench"))]


def scenario_names() -> list[str]:
    return sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))


def envs_home(home: Path) -> dict[str, Path]:
    """`home` made a state folder whose envs are the ones setup made (a link to them); the paths
    the output may show, by the name `normalise` writes each (the envs first: they may lie inside
    the checkout)."""
    from framework_bench.envs import venvs

    envs = (venvs.fbench_home() / "envs").resolve()
    home.mkdir(parents=True)
    (home / "envs").symlink_to(envs)
    return {"<ENVS>": envs, "<HOME>": home, "<ROOT>": ROOT}


class Capture:
    """The commands run in one state folder (`envs_home`), their output normalised."""

    def __init__(self, places: dict[str, Path]):
        self.places = places

    def run(self, argv: list[str]) -> str:
        env = {**os.environ, "COLUMNS": "100", "TERM": "dumb", "NO_COLOR": "1",
               "FBENCH_HOME": str(self.places["<HOME>"])}
        done = subprocess.run(fbench() + argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
        return f"exit {done.returncode}\n{done.stdout}"

    def normalise(self, text: str) -> str:
        for name, path in self.places.items():
            text = text.replace(str(path), name)
        text = re.sub(r"""\d{8}-\d{6}-[\w.-]+?-\d+(?=[/\\"'\s]|$)""", "<RUN>", text)
        text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<PORT>", text)
        text = re.sub(r"(MASTER_PORT\"?:\s*\"?)\d+", r"\1<PORT>", text)
        return text

    def printed(self, argv: list[str]) -> str:
        return self.normalise(self.run(argv))

    def dry_run(self, scenario: str) -> str:
        """The dry-run records, each with the text files its plan wrote (job.json, configs)."""
        out = self.run(["compare", "--dry-run", "--json", "--scenario", scenario, "--backends", BACKENDS])
        head, _, body = out.partition("\n")
        try:
            records = json.loads(body)
        except json.JSONDecodeError:
            return self.normalise(out)
        for record in records:
            written = {}
            for label, path in sorted((record.get("files") or {}).items()):
                p = Path(path)
                if p.is_file():
                    written[label] = p.read_text(errors="replace").splitlines()
                elif p.is_dir():
                    written[label] = sorted(c.name for c in p.iterdir())
            record["written"] = written
        return self.normalise(head + "\n" + json.dumps(records, indent=1, sort_keys=True))


def capture() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        at = Capture(envs_home(Path(tmp) / "home"))
        jobs: dict[str, tuple] = {}
        for name in scenario_names():
            jobs[f"dry-run/{name}.json"] = (at.dry_run, name)
            jobs[f"show/{name}.json"] = (at.printed, ["show", "--json", name])
        for cmd in COMMANDS:
            jobs["help/" + ("_".join(cmd) or "fbench") + ".txt"] = (at.printed, cmd + ["--help"])
        # a copy: the fixture stays as written, whatever a command does with the file it is given
        # (schema 6, before trials), so that its rows are read as old rows every time
        store = Path(shutil.copy(FIXTURE_STORE, tmp))
        jobs["results-export.json"] = (at.printed, ["results", "export", "--format", "json", "--db", str(store)])
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
