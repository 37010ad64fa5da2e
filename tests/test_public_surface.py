"""What a plugin may import (CONTRIBUTING.md, "What a plugin may import"): every name listed
there imports without a warning, and every old path listed there still imports the very same
objects, warning (DeprecationWarning) with its new home and its removal release, until that
release (framework_bench/_compat.py holds them all)."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _section() -> str:
    text = (ROOT / "CONTRIBUTING.md").read_text()
    return text.split("### What a plugin may import", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


def public_names() -> dict[str, list[str]]:
    """Module -> its listed names, from the section's lines "- `module`: `name`, `name`"."""
    return {m[1]: re.findall(r"`(\w+)`", m[2])
            for m in re.finditer(r"^- `(framework_bench[\w.]*)`: (.*)$", _section(), re.M)}


def old_paths() -> list[tuple[str, str]]:
    """(old path, new home) from the section's lines "- `old`, `.attr` ... → `new`"."""
    pairs = []
    for m in re.finditer(r"^- (.*?) → `(framework_bench[\w.]*)`", _section(), re.M):
        first = None
        for path in re.findall(r"`((?:framework_bench|\.)[\w.]*)`", m[1]):
            if path.startswith("."):  # `.name`: an attribute of the module named first
                path = first.rsplit(".", 1)[0] + path
            first = first or path
            pairs.append((path, m[2]))
    return pairs


def test_the_section_lists_the_surface():
    names = public_names()
    assert "framework_bench.plugins.base" in names and "Backend" in names["framework_bench.plugins.base"]
    assert "hookimpl" in names["framework_bench.plugins.hookspecs"] and "StepTimer" in names["framework_bench.worker"]
    assert ("framework_bench.scenario", "framework_bench.spec.scenario") in old_paths()
    assert ("framework_bench.plugins.get", "framework_bench.plugins.registry") in old_paths()


def test_every_public_name_imports_without_a_warning():
    """In a fresh interpreter (nothing imported before), warnings as errors: no public name
    may lean on a deprecated path."""
    lines = [f"from {module} import {', '.join(names)}" for module, names in public_names().items()]
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", "\n".join(lines)],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def test_the_bundled_backends_and_contract1_plugin_import_only_the_surface_or_old_paths():
    """What the bundled backends and the kept contract-1 plugin import from fbench is listed."""
    import ast

    names, old = public_names(), dict(old_paths())
    listed = {f"{module}.{name}" for module, module_names in names.items() for name in module_names}
    sources = [*ROOT.glob("backends/*/fbench_*/*.py"), ROOT / "tests/contract1_backend/plugin.py"]
    unlisted = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("framework_bench"):
                for alias in node.names:
                    path = f"{node.module}.{alias.name}"
                    if not ({path, node.module} & (listed | set(names) | set(old))):
                        unlisted.add(f"{path} ({source.relative_to(ROOT)})")
    assert not unlisted, sorted(unlisted)


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_every_deprecated_name_has_a_removal_release_still_to_come():
    """One minor release of warning: each entry names the release that removes it, later than
    this one, so that bumping the version to it fails here until the entry and its path go."""
    import framework_bench
    from framework_bench import _compat

    entries = {**_compat.MODULES, **_compat.ATTRIBUTES}
    assert entries
    for old, moved in entries.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", moved.removal), (old, moved)
        assert _release(framework_bench.__version__) < _release(moved.removal), (old, moved)


def test_the_old_paths_listed_are_the_deprecated_names_kept():
    """CONTRIBUTING's list and framework_bench/_compat.py name the same old paths and homes."""
    from framework_bench import _compat

    listed = dict(old_paths())
    kept = {old: moved.home for old, moved in {**_compat.MODULES, **_compat.ATTRIBUTES}.items()}
    assert {old: listed.get(old) for old in kept} == kept
    assert set(listed) <= set(kept)


@pytest.mark.parametrize("old, new", old_paths())
def test_an_old_path_warns_naming_its_new_home_and_keeps_the_objects(old, new):
    module_name, _, attr = old.rpartition(".")
    try:
        importlib.import_module(module_name)
        parent_is_module = True
    except ImportError:
        parent_is_module = False
    if parent_is_module and not _is_module(old):  # an attribute kept on a package
        parent = importlib.import_module(module_name)
        with pytest.warns(DeprecationWarning, match=_warning(old, new)):
            value = getattr(parent, attr)
        home = importlib.import_module(new)
        assert value is getattr(home, attr, None) or value is getattr(home, "Registered" + attr)
        return
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=_warning(old, new)):
        module = importlib.import_module(old)
    home = importlib.import_module(new)
    kept = [name for name in vars(home) if not name.startswith("__")]
    assert kept and all(getattr(module, name) is getattr(home, name) for name in kept)


def _warning(old: str, new: str) -> str:
    """What the warning of an old path says: its new home and the release that removes it."""
    from framework_bench import _compat

    removal = {**_compat.MODULES, **_compat.ATTRIBUTES}[old].removal
    return re.escape(f"{old} moved to {new}") + ".*" + re.escape(f"removed in {removal}")


def _is_module(path: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return importlib.util.find_spec(path) is not None
        except (ImportError, AttributeError):
            return False


def test_the_envs_attribute_shim_covers_the_former_module():
    from framework_bench.envs import creation, venvs

    import framework_bench.envs as old
    with pytest.warns(DeprecationWarning, match="framework_bench.envs.create moved to framework_bench.envs.creation.create"):
        assert old.create is creation.create
    with pytest.warns(DeprecationWarning, match="framework_bench.envs.inspect moved to framework_bench.envs.venvs.inspect"):
        assert old.inspect is venvs.inspect
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018 - an unknown name stays an AttributeError


# A plugin written against the previous release's CONTRIBUTING: its module-level hooks
# (tests/contract1_backend/plugin.py) declaring the memory scheme through `framework_bench.memory`
# and annotating with `framework_bench.scenario.Scenario`, as that CONTRIBUTING and the bundled
# plugins of the time did, and its worker on worker_io, packed and init_weights (contract1_backend/worker.py).
OLD_IMPORTS = ("from framework_bench.memory import AdamWImpl, MemoryScheme\n"
               "from framework_bench.scenario import Scenario\n")
OLD_MEMORY = ('framework_package="torch"),\n                       memory=MemoryScheme(adamw={"matched": '
              'AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused")}))')


def previous_release_plugin(site: Path) -> None:
    """Install it into `site` (on sys.path) through an entry point, like any third-party plugin;
    its requirements are the torch backend's, so the torch env serves as its own."""
    kept = ROOT / "tests" / "contract1_backend"
    package = site / "fbench_mybackend"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    plugin = (kept / "plugin.py").read_text().replace("from framework_bench.hookspecs", OLD_IMPORTS
                                                     + "from framework_bench.hookspecs")
    plugin = plugin.replace('framework_package="torch"))', OLD_MEMORY).replace(
        "def fbench_check(scenario, machine, env):", "def fbench_check(scenario: Scenario, machine, env):")
    assert "framework_bench.memory" in plugin and "MemoryScheme(" in plugin and "scenario: Scenario" in plugin
    (package / "plugin.py").write_text(plugin)
    (package / "worker.py").write_text((kept / "worker.py").read_text())
    (package / "requirements-cpu.txt").write_bytes((ROOT / "backends/torch/fbench_torch/requirements-cpu.txt").read_bytes())
    info = site / "fbench_mybackend-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fbench-mybackend\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[fbench.backends]\nmybackend = fbench_mybackend.plugin\n")


@pytest.mark.slow
def test_a_plugin_of_the_previous_release_installs_runs_and_is_unverified_not_broken(tmp_path, monkeypatch):
    import os

    from backend_helpers import CPU
    from fbench_fixtures import backend_env_or_skip
    from framework_bench.data.packing import pack
    from framework_bench.plugins import registry
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.spec import scenario

    torch_env = backend_env_or_skip("torch")
    site = tmp_path / "site"
    previous_release_plugin(site)
    home = tmp_path / "home"
    (home / "envs").mkdir(parents=True)
    for name in ("mybackend", "torch"):  # its env: made from the same requirements as torch's
        (home / "envs" / name).symlink_to(torch_env.path)
    monkeypatch.setenv("FBENCH_HOME", str(home))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    importlib.invalidate_caches()
    sys.modules.pop("framework_bench.memory", None)  # imported afresh, as in a new host process

    with pytest.warns(DeprecationWarning, match="framework_bench.memory moved to framework_bench.measure.memory"):
        backend = registry.get("mybackend")  # not broken: the old paths it imports are kept
    assert backend.info.memory.adamw["matched"].cuda == "fused" and backend.info.contract == 1
    scn = scenario.load("tiny_cpu")
    data = pack(scn, progress=False, say=lambda msg: None)
    result = pipeline.run_one("mybackend", scn, RunOptions(root=tmp_path / "runs"), data=data, machine=CPU)
    assert result.status in ("unverified", "ok"), result.reason
    checks = {c.name: c.status for c in result.checks}
    for name in ("tokens", "steps", "rows", "initial_weights", "clock"):  # the claims it makes still hold
        assert checks[name] == "pass", (name, result.checks)
