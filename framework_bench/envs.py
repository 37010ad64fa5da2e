"""One virtual environment per backend, made and reused by the project.

XTuner 0.2.0 pins transformers==4.48.0 and LLaMA-Factory 0.9.5 needs >=4.55: no single
environment holds both, so each backend's worker runs with its own env's Python.

Layout: `$FBENCH_HOME/envs/<backend>/` (default `FBENCH_HOME=<project>/.fbench`), with
`fbench-env.json` recording the flavour, the requirements hash, the resolved versions
and how long creation took. Creating again with unchanged requirements does nothing.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from framework_bench.backend import BackendEnv, EnvSpec
from framework_bench.scenario import PROJECT_ROOT

RECORD = "fbench-env.json"
PTH_NAME = "fbench_host.pth"
COPY_MARK = ".fbench-copy"  # in a package folder `_link_packages` copied into an env
Flavour = Literal["cpu", "cuda"]


class EnvError(RuntimeError):
    pass


def fbench_home() -> Path:
    return Path(os.environ.get("FBENCH_HOME", PROJECT_ROOT / ".fbench"))


def env_path(name: str) -> Path:
    return fbench_home() / "envs" / name


def default_flavour() -> Flavour:
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def _python(path: Path) -> Path:
    return path / "bin" / "python"


def _requirements_hash(spec: EnvSpec, flavour: Flavour) -> str:
    return hashlib.sha256(spec.requirements[flavour].read_bytes()).hexdigest()


def inspect(name: str, spec: EnvSpec | None = None) -> BackendEnv:
    """The env as found on disk; `ready` only if it was completed and still matches its requirements."""
    path = env_path(name)
    env = BackendEnv(name=name, path=path, python=_python(path))
    record_file = path / RECORD
    if not record_file.exists():
        env.problem = "not created (run `fbench env create %s`)" % name
        return env
    try:
        record = json.loads(record_file.read_text())
        env.flavour, env.versions = record["flavour"], dict(record["versions"])
        made_from = record.get("requirements_sha256")
        if env.flavour not in ("cpu", "cuda"):
            raise ValueError(env.flavour)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged record: remade, never a traceback
        env.flavour, env.versions = None, {}
        env.problem = f"broken: its record {record_file} is unreadable ({type(e).__name__}; run `fbench env create {name}`)"
        return env
    if not env.python.exists():
        env.problem = "broken: its Python is missing"
    elif spec is not None and made_from != _requirements_hash(spec, env.flavour):
        env.problem = "stale: requirements changed since it was made (run `fbench env create %s`)" % name
    else:
        env.ready = True
    return env


def _run(argv: list[str], log, **kw) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, **kw)
    if proc.returncode:
        raise EnvError(f"`{' '.join(argv[:4])} ...` exited {proc.returncode}; see {log.name}")


def _freeze(python: Path) -> dict[str, str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True)
    return {d["name"]: d["version"] for d in json.loads(out.stdout)}


def create(
    name: str,
    spec: EnvSpec,
    flavour: Flavour | None = None,
    say: Callable[[str], None] = lambda msg: None,
    packages: tuple[str, ...] = (),
) -> BackendEnv:
    """Create (or reuse) the env of backend `name`; idempotent. `packages` are the plugin's
    top-level import packages its worker needs (besides `framework_bench`)."""
    flavour = flavour or default_flavour()
    current = inspect(name, spec)
    if current.ready and current.flavour == flavour:
        _link_packages(current.python, ("framework_bench", *packages))
        say(f"{name}: ready at {current.path} (nothing to do)")
        return current
    path = env_path(name)
    if path.exists():
        say(f"{name}: removing the old env ({current.problem or current.flavour})")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    started = time.monotonic()
    python = _python(path)
    with (path / "create.log").open("w") as log:
        say(f"{name}: creating venv at {path}")
        _run([sys.executable, "-m", "venv", str(path)], log)
        say(f"{name}: pip install -r {spec.requirements[flavour].name} (a few minutes)")
        # pip, not uv: only pip sees the local CPU torch build this machine offers.
        _run([str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
              "-r", str(spec.requirements[flavour])], log)
        _link_packages(python, ("framework_bench", *packages))
        for module in spec.post_install:
            say(f"{name}: post-install {module}")
            _run([str(python), "-m", module, flavour], log, cwd=path)
    record = {
        "name": name,
        "flavour": flavour,
        "requirements": str(spec.requirements[flavour]),
        "requirements_sha256": _requirements_hash(spec, flavour),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.monotonic() - started, 1),
        "host_python": sysconfig.get_python_version(),
        "versions": _freeze(python),
    }
    (path / RECORD).write_text(json.dumps(record, indent=2))
    say(f"{name}: ready in {record['seconds']:.0f} s")
    return inspect(name, spec)


def _link_packages(python: Path, packages: tuple[str, ...]) -> None:
    """Make the host's `framework_bench` and the plugin's own package importable by the
    worker. A package imported from a source folder (an editable install, a checkout) is
    reached through a .pth in the env listing that folder; a .pth *appends* to sys.path, so
    the env's own packages always win. A package installed as files into a site-packages
    (a non-editable `pip install`) is copied into the env instead: listing that site-packages
    would put every host package on the worker's path. Redone on every create, so the env
    follows the checkout or the installed version the host runs."""
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    roots = []
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise EnvError(f"cannot find the package {package!r} to make it importable in the env")
        folder = Path(next(iter(spec.submodule_search_locations)))
        copy = purelib / package
        if (copy / COPY_MARK).exists():
            shutil.rmtree(copy)  # ours, from an earlier create: refreshed below or dropped
        elif copy.exists():
            raise EnvError(f"the env's own {package!r} at {copy} hides the host's: a requirement installs it")
        if _installed_as_files(package, folder):
            shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("__pycache__"))
            (copy / COPY_MARK).write_text(f"copied from {folder} by fbench env create\n")
        elif str(folder.parent) not in roots:
            roots.append(str(folder.parent))
    Path(purelib, PTH_NAME).write_text("".join(r + "\n" for r in roots))


def _installed_as_files(package: str, folder: Path) -> bool:
    """Whether `package` at `folder` is a distribution's installed files (an installer's
    RECORD lists them there) rather than a source folder: an editable install's RECORD
    lists only its path hook, and a checkout's egg-info has no RECORD."""
    from importlib.metadata import distributions, packages_distributions

    names = set(packages_distributions().get(package, []))
    for dist in (d for name in names for d in distributions(name=name)):
        if dist.read_text("RECORD") is None:
            continue
        init = next((f for f in dist.files or [] if f.parts[:1] == (package,) and f.name == "__init__.py"), None)
        if init is not None and Path(dist.locate_file(init)).resolve().parent == folder.resolve():
            return True
    return False


def size_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
