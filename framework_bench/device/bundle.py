"""`fbench device bundle DIR`: the third-party wheels an offline GPU machine lacks, for its Python.

The lists in `benchmarks/device/requirements-<list>.txt` name what fbench's host and each backend's
worker path import beyond what that machine holds (`h200-python312.txt`); each is installed there
with `--no-index --no-deps` (the frameworks declare dependencies their training path never imports).
Every wheel is fetched for the target Python and platform (built here when the index has only a
source distribution: deepspeed), stored once by sha256 in `DIR/wheels/`, checked against the target
with `packaging.tags`, and named in `DIR/manifest.json`. fbench and the bundled backends are not
in it: the checkout travels with the run and installs them editable (framework_bench/device/install.py).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from pydantic import BaseModel

from framework_bench.scenario import catalog
from framework_bench.scenario.scenario import PROJECT_ROOT

LISTS_DIR = PROJECT_ROOT / "benchmarks" / "device"
DATA_DIR = catalog.SHIPPED_DATA / "alpaca-demo"
MANIFEST = "manifest.json"
MAX_BYTES = 56 * 2**20  # it travels with the checkout (its tracked files about 5 MiB): 64 MiB in all
# The GPU machine is x86-64 Linux; pip matches each manylinux tag exactly, so all are named.
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64")


class BundleError(RuntimeError):
    pass


class Wheel(BaseModel):
    file: str
    name: str
    version: str
    sha256: str
    bytes: int
    built_here: bool = False


class Manifest(BaseModel):
    python: str
    platforms: list[str]
    lists: dict[str, list[str]]  # list name -> the wheel files it installs
    wheels: list[Wheel]
    data: dict[str, str]  # file under data/ -> sha256
    total_bytes: int


def list_names(lists_dir: Path = LISTS_DIR) -> list[str]:
    return sorted(p.stem.removeprefix("requirements-") for p in lists_dir.glob("requirements-*.txt"))


def read_list(path: Path) -> list[Requirement]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    reqs = [Requirement(line) for line in lines if line]
    for r in reqs:
        pins = [s for s in r.specifier if s.operator == "=="]
        if len(pins) != 1:
            raise BundleError(f"{path}: {r} must pin one version (==): --no-deps installs exactly what is listed")
    return reqs


def target_tags(python: str, platforms: tuple[str, ...] = PLATFORMS) -> set[Tag]:
    version = tuple(int(p) for p in python.split("."))
    interpreter = f"cp{version[0]}{version[1]}"
    return {*cpython_tags(version, [interpreter], platforms), *compatible_tags(version, interpreter, platforms)}


def check_tags(wheel: Path, tags: set[Tag]) -> None:
    if not parse_wheel_filename(wheel.name)[3] & tags:
        raise BundleError(f"{wheel.name} does not install on the target (its tags match none of the target's)")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _pip() -> list[str]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]


def _download(reqs: list[Requirement], python: str, platforms: tuple[str, ...], into: Path, log) -> bool:
    argv = [*_pip(), "download", "--no-deps", "--only-binary=:all:", "--python-version", python,
            "--implementation", "cp", "-d", str(into), *map(str, reqs)]
    for platform in platforms:
        argv += ["--platform", platform]
    return subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT).returncode == 0


def _fetch(reqs: list[Requirement], python: str, platforms: tuple[str, ...], into: Path, log) -> set[str]:
    """The wheels of `reqs` for the target in `into` (one pip call per list; one per package
    when some has no wheel); returns the names of those built here."""
    if _download(reqs, python, platforms, into, log):
        return set()
    built = set()
    for req in reqs:
        if _download([req], python, platforms, into, log):
            continue
        # No wheel on the index (deepspeed ships an sdist): build one here. Its ops stay off
        # (DS_BUILD_OPS=0): they are compiled at first use where they run. The tag check then
        # refuses anything the build made for this machine rather than the target.
        done = subprocess.run([*_pip(), "wheel", "--no-deps", "-w", str(into), str(req)], stdout=log,
                              stderr=subprocess.STDOUT, env={**os.environ, "DS_BUILD_OPS": "0"})
        if done.returncode:
            raise BundleError(f"no wheel of {req} for Python {python} and none could be built here; see {log.name}")
        built.add(canonicalize_name(req.name))
    return built


def build(dest: Path, python: str = "3.12", platforms: tuple[str, ...] = PLATFORMS, lists_dir: Path = LISTS_DIR,
          max_bytes: int = MAX_BYTES, say: Callable[[str], None] = lambda m: None) -> Manifest:
    dest.mkdir(parents=True, exist_ok=True)
    wheels_dir = dest / "wheels"
    if wheels_dir.exists():
        shutil.rmtree(wheels_dir)  # a rebuild holds exactly what the lists name now
    wheels_dir.mkdir()
    tags = target_tags(python, platforms)
    by_sha: dict[str, Wheel] = {}
    lists: dict[str, list[str]] = {}
    with (dest / "bundle.log").open("w") as log, tempfile.TemporaryDirectory() as tmp:
        for name in list_names(lists_dir):
            reqs = read_list(lists_dir / f"requirements-{name}.txt")
            lists[name] = []
            into = Path(tmp, name)
            into.mkdir()
            say(f"{name}: {' '.join(map(str, reqs))}")
            built_here = _fetch(reqs, python, platforms, into, log)
            wheels = {parse_wheel_filename(w.name)[0]: w for w in into.glob("*.whl")}
            for req in reqs:
                wheel = wheels.get(canonicalize_name(req.name))
                if wheel is None:
                    raise BundleError(f"asked for {req}, pip fetched no wheel of it; see {log.name}")
                check_tags(wheel, tags)
                version = parse_wheel_filename(wheel.name)[1]
                if version not in req.specifier:
                    raise BundleError(f"asked for {req}, got {wheel.name}")
                built = canonicalize_name(req.name) in built_here
                digest = sha256(wheel)
                if digest not in by_sha:
                    if (wheels_dir / wheel.name).exists():
                        raise BundleError(f"two different builds named {wheel.name}")
                    shutil.copy2(wheel, wheels_dir / wheel.name)
                    by_sha[digest] = Wheel(file=wheel.name, name=canonicalize_name(req.name), version=str(version), sha256=digest,
                                           bytes=wheel.stat().st_size, built_here=built)
                lists[name].append(by_sha[digest].file)
            # What pip installs, by pin, from --find-links wheels/ with --no-index --no-deps.
            (dest / f"requirements-{name}.txt").write_text("".join(f"{r}\n" for r in reqs))
    data = {}
    shutil.rmtree(dest / "data", ignore_errors=True)
    shutil.copytree(DATA_DIR, dest / "data" / DATA_DIR.name)
    for f in sorted((dest / "data").rglob("*")):
        if f.is_file():
            data[str(f.relative_to(dest / "data"))] = sha256(f)
    total = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file() and f.name != MANIFEST)
    manifest = Manifest(python=python, platforms=list(platforms), lists=lists, wheels=list(by_sha.values()),
                        data=data, total_bytes=total)
    (dest / MANIFEST).write_text(manifest.model_dump_json(indent=2))
    if total > max_bytes:
        raise BundleError(f"the bundle is {total / 2**20:.1f} MiB, over its {max_bytes / 2**20:.0f} MiB "
                          "(it travels with the checkout, 64 MiB in all)")
    return manifest


def verify(dest: Path) -> Manifest:
    """The bundle as the manifest says: every wheel there, unchanged, installable on its target."""
    manifest = Manifest.model_validate_json((dest / MANIFEST).read_text())
    tags = target_tags(manifest.python, tuple(manifest.platforms))
    for w in manifest.wheels:
        path = dest / "wheels" / w.file
        if not path.is_file() or sha256(path) != w.sha256:
            raise BundleError(f"{path}: missing or not the wheel the manifest names")
        check_tags(path, tags)
    return manifest
