"""One virtual environment per backend: where it lives, what it holds, and whether it is ready.

XTuner 0.2.0 pins transformers==4.48.0 and LLaMA-Factory 0.9.5 needs >=4.55: no single
environment holds both, so each backend's worker runs with its own env's Python.

Layout: `<state folder>/envs/<backend>/` (`FBENCH_HOME`, else as `framework_bench/scenario/places.py` says), with
`fbench-env.json` recording the flavour, the requirements hash, the resolved versions, how long
creation took, that the worker SDK imports there, and the host packages made importable in it
(a copied plugin's version and source hash: `inspect` calls the env stale once the host's plugin
differs). `framework_bench/envs/creation.py` makes it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Literal

from framework_bench.envs.host_packages import changed_links
from framework_bench.envs.sdk_check import sdk_missing
from framework_bench.envs.smoke import OPTIONAL_IMPORTS
from framework_bench.plugins.contract import BackendEnv, EnvSpec
from framework_bench.scenario import places

RECORD = "fbench-env.json"
STALE_PLUGIN = "stale: plugin changed since env create"  # its copy in the env: `env create` refreshes it
Flavour = Literal["cpu", "cuda"]
FLAVOURS: tuple[Flavour, ...] = ("cpu", "cuda")


def fbench_home() -> Path:
    """The state folder: see `framework_bench/scenario/places.py`."""
    return places.state_dir()


def env_path(name: str) -> Path:
    return fbench_home() / "envs" / name


def bytecode_dir() -> Path:
    """Where workers write bytecode when the shell forbids it (launchers/local.py): beside the envs
    it was compiled from, so every state folder whose envs are the same ones shares it."""
    return fbench_home() / "envs" / ".bytecode"


def env_python(path: Path) -> Path:
    return path / "bin" / "python"


def requirements_hash(spec: EnvSpec, flavour: Flavour) -> str:
    return hashlib.sha256(spec.requirements[flavour].read_bytes()).hexdigest()


def inspect(name: str, spec: EnvSpec | None = None) -> BackendEnv:
    """The env as found on disk; `ready` only if it was completed, still matches its requirements,
    holds the worker SDK's requirements and its copies of host packages match the host's."""
    path = env_path(name)
    # The python through the links: the bytecode beside the envs is filed under the source path a
    # worker imports from, so every state folder reaching these envs through a link shares it.
    env = BackendEnv(name=name, path=path, python=env_python(path.resolve()))
    record_file = path / RECORD
    if not record_file.exists():
        env.problem = "not created (run `fbench env create %s`)" % name
        return env
    try:
        record = json.loads(record_file.read_text())
        env.flavour = record["flavour"]
        made_from = record.get("requirements_sha256")
        site_dirs = list(record.get("site_dirs", []))
        linked = dict(record.get("linked") or {})  # absent from an env made before fbench recorded it
        if env.flavour not in FLAVOURS:
            raise ValueError(env.flavour)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged record: remade, never a traceback
        env.flavour = None
        env.problem = f"broken: its record {record_file} is unreadable ({type(e).__name__}; run `fbench env create {name}`)"
        return env
    # Read afresh each time, not frozen at creation: a package installed by hand (flash-attn,
    # say) is seen, and the plugins stop refusing what it enables.
    env.versions = installed_versions(path, site_dirs)
    # An optional package the smoke test saw fail to import is not there for the plugins
    # (`env.has` reads metadata only): its scenarios are refused until the env is re-created.
    for module, state in (record.get("smoke_test") or {}).items():
        if module in OPTIONAL_IMPORTS and str(state).startswith("import fails"):
            for dist in [d for d in env.versions if d.lower().replace("-", "_") == module]:
                del env.versions[dist]
    if not env.python.exists():
        env.problem = "broken: its Python is missing"
    elif spec is not None and made_from != requirements_hash(spec, env.flavour):
        env.problem = "stale: requirements changed since it was made (run `fbench env create %s`)" % name
    elif missing := sdk_missing(env.versions):
        # Every run's worker would die importing the SDK: refused before it starts, saying why.
        env.problem = (f"broken: the worker SDK (framework_bench.worker) cannot import there: No module named "
                       f"{missing[0]!r}, one of its requirements (run `fbench env create {name}`)")
    elif changed := changed_links(linked):
        env.problem = f"{STALE_PLUGIN} ({changed}; run `fbench env create {name}`)"
    else:
        env.ready = True
    return env


def installed_versions(path: Path, extra_site_dirs: list[str] = ()) -> dict[str, str]:
    """Distribution name -> version, read from the `*.dist-info/METADATA` files of the env's
    site-packages (then of `extra_site_dirs`, e.g. the system's with --system-site-packages;
    the env's own copy wins, as on its sys.path). Milliseconds, where `pip list` takes seconds."""
    versions: dict[str, str] = {}
    dirs = [*sorted(path.glob("lib/python3*/site-packages")), *map(Path, extra_site_dirs)]
    for site in dirs:
        for metadata in sorted(site.glob("*.dist-info/METADATA")):
            name = version = None
            with metadata.open(encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                    if (name and version) or not line.strip():
                        break
            if name and version:
                versions.setdefault(name, version)
    return versions
