"""The host's packages made importable in a backend's env: `framework_bench` and the plugin's own.

A package imported from a source folder (an editable install, a checkout) is reached through a
.pth in the env listing that folder; a .pth *appends* to sys.path, so the env's own packages
always win. A package installed as files into a site-packages (a non-editable `pip install`) is
copied into the env instead: listing that site-packages would put every host package on the
worker's path. A copy goes stale when the host's package changes (`changed_links`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path

from framework_bench.envs import site_layers
from framework_bench.envs.errors import EnvError

PTH_NAME = "fbench_host.pth"
COPY_MARK = ".fbench-copy"  # in a package folder `link_packages` copied into an env


def _find(package: str):
    """The host's import spec of `package`; None where the host cannot import it."""
    spec = importlib.util.find_spec(package)
    return None if spec is None or not (spec.submodule_search_locations or spec.origin) else spec


def _source(spec) -> Path:
    """Where a package is imported from: its folder, or the file of a one-module plugin."""
    return Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations \
        else Path(spec.origin)


def link_packages(python: Path, packages: tuple[str, ...]) -> dict[str, dict]:
    """Make the host's `packages` importable by the worker of the env of `python`, by .pth or
    copy. Redone on every create, so the env follows the checkout or the installed version the
    host runs. Returns, by package, where it comes from and, for a copy, its distribution's
    version and its files' hash (`changed_links`)."""
    purelib = site_layers.purelib(python)
    roots, linked = [], {}
    for package in packages:
        spec = _find(package)
        if spec is None:
            raise EnvError(f"cannot find the package {package!r} to make it importable in the env")
        source = _source(spec)
        copy = purelib / source.name
        mark = copy / COPY_MARK if spec.submodule_search_locations else purelib / (source.name + COPY_MARK)
        if mark.exists():  # ours, from an earlier create: refreshed below or dropped
            if copy.is_dir():
                shutil.rmtree(copy)  # the mark inside goes with it
            else:
                copy.unlink(missing_ok=True)
                mark.unlink()
        elif copy.exists():
            raise EnvError(f"the env's own {package!r} at {copy} hides the host's: a requirement installs it")
        if _installed_as_files(package, Path(spec.origin) if spec.origin else source / "__init__.py"):
            if source.is_dir():
                shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy)
            mark.write_text(f"copied from {source} by fbench env create\n")
            linked[package] = {"source": str(source), "copied": True, "version": _dist_version(package),
                               "sha256": source_sha256(source)}
        else:
            linked[package] = {"source": str(source), "copied": False}
            if str(source.parent) not in roots:
                roots.append(str(source.parent))
    Path(purelib, PTH_NAME).write_text("".join(r + "\n" for r in roots))
    return linked


def changed_links(linked: dict[str, dict]) -> str | None:
    """How the host packages an env was made with differ from those the host imports now, or None.
    A package reached through a .pth follows its folder by itself; a copy goes stale silently
    when its distribution is upgraded or reinstalled (its version, or its files' hash), and either
    is wrong once the package comes from elsewhere (an editable install become a wheel, say)."""
    changes = []
    for package, was in linked.items():
        spec = _find(package)
        if spec is None:
            changes.append(f"{package}: no longer importable by the host")
            continue
        source = _source(spec)
        if str(source) != was.get("source"):  # an installed package and its checkout are two places
            changes.append(f"{package} now from {source}, was {was.get('source')}")
        elif was.get("copied") and (now := _dist_version(package)) != was.get("version"):
            changes.append(f"{package} version {was.get('version')}→{now}")
        elif was.get("copied") and (now := source_sha256(source)) != was.get("sha256"):
            changes.append(f"{package} source sha256 {str(was.get('sha256'))[:12]}→{now[:12]}")
    return "; ".join(changes) or None


def source_sha256(source: Path) -> str:
    """The sha256 of a package's files (names and bytes, byte code left out): what a copy holds."""
    h = hashlib.sha256()
    files = sorted(f for f in source.rglob("*") if f.is_file() and "__pycache__" not in f.parts) \
        if source.is_dir() else [source]
    for f in files:
        h.update(f.relative_to(source.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _dist_version(package: str) -> str | None:
    from importlib.metadata import packages_distributions, version

    names = packages_distributions().get(package) or []
    return version(names[0]) if names else None


def _installed_as_files(package: str, origin: Path) -> bool:
    """Whether `package`, imported from `origin` (its `__init__.py`, or the module file of a
    one-module plugin), is a distribution's installed files (an installer's RECORD lists them
    there) rather than a source folder: an editable install's RECORD lists only its path hook,
    and a checkout's egg-info has no RECORD."""
    from importlib.metadata import distributions, packages_distributions

    names = set(packages_distributions().get(package, []))
    for dist in (d for name in names for d in distributions(name=name)):
        if dist.read_text("RECORD") is None:
            continue
        if any(f.parts[:1] in ((package,), (f"{package}.py",)) and Path(dist.locate_file(f)).resolve() == origin.resolve()
               for f in dist.files or []):
            return True
    return False
