"""Every deprecated name of fbench, with the release that removes it (CONTRIBUTING.md,
"Compatibility policy").

A name that moves keeps its old path for one minor release: importing it gives the very same
objects and warns (DeprecationWarning) naming the new home and the removal release; at that
release its entry here goes, and with it the path. Old module paths are served by the import
hook below (`install`, called by `framework_bench/__init__.py`), old package attributes by the
packages' `__getattr__` (`attribute`).

Stdlib only, and nothing imported before an old path is asked for: workers import
`framework_bench` in envs without pydantic, and `fbench --help` must stay quick.
"""

from __future__ import annotations

import importlib
import sys
import warnings
from importlib.machinery import ModuleSpec
from typing import NamedTuple


class Moved(NamedTuple):
    home: str  # the module that holds it now
    removal: str  # the release that removes the old path
    note: str = ""  # where part of it went instead, said in the warning
    # An old module whose names now live in more than one place: "module" (all its names) or
    # "module:name", served beside the home's (whose names win).
    also: tuple[str, ...] = ()
    name: str = ""  # an attribute's name in `home`, where it was renamed


# Old module path -> where its names live now.
MODULES = {
    "framework_bench.backend": Moved("framework_bench.plugins.contract", "0.3.0"),
    "framework_bench.plugins.backend": Moved("framework_bench.plugins.contract", "0.3.0"),
    "framework_bench.hookspecs": Moved("framework_bench.plugins.hookspecs", "0.3.0"),
    "framework_bench.memory": Moved("framework_bench.measure.memory", "0.3.0",
                                    note="MemoryScheme, AdamWImpl: framework_bench.plugins.contract",
                                    also=("framework_bench.plugins.contract:AdamWImpl",
                                          "framework_bench.plugins.contract:MemoryScheme")),
    "framework_bench.launch": Moved("framework_bench.plugins.plan_env", "0.3.0",
                                    note="launchers: framework_bench.run.launchers"),
    "framework_bench.scenario": Moved("framework_bench.spec.scenario", "0.3.0"),
    "framework_bench.models": Moved("framework_bench.spec.models", "0.3.0"),
    "framework_bench.runner": Moved("framework_bench.run.pipeline", "0.3.0", note="dry runs: framework_bench.run.dry_run",
                                    also=("framework_bench.run.dry_run",)),
    "framework_bench.worker_io": Moved("framework_bench.worker.files", "0.3.0", note="load_job: framework_bench.worker",
                                       also=("framework_bench.worker.job:load_job",)),
    "framework_bench.packed": Moved("framework_bench.worker.packed", "0.3.0"),
    "framework_bench.worker.init_weights": Moved("framework_bench.worker.initial_weights_worker", "0.3.0"),
    "framework_bench.worker.initial_weights": Moved("framework_bench.worker.initial_weights_host", "0.3.0"),
}

# Old package attribute -> its module now: `framework_bench.plugins` was the registry module, and
# `framework_bench.envs` one module, since split by concern (_ENVS: each part's names).
_REGISTRY = "framework_bench.plugins.registry"
_ENVS = {
    "errors": ("EnvError",),
    "venvs": ("inspect", "fbench_home", "env_path", "installed_versions", "RECORD", "STALE_PLUGIN", "Flavour",
              "FLAVOURS"),
    "torch_index": ("TORCH_INDEXES", "default_flavour", "driver_cuda_version", "parse_driver_cuda", "torch_index_for"),
    "smoke": ("OPTIONAL_IMPORTS", "SMOKE_TEST", "smoke_test"),
    "sdk_check": ("SDK_REQUIREMENTS", "SDK_IMPORT", "sdk_missing", "sdk_import_error"),
    "host_packages": ("PTH_NAME", "COPY_MARK", "source_sha256"),
    "pip_options": ("Options", "pip_argv", "validate"),
    "creation": ("create", "sweep_building"),
}
ATTRIBUTES = {
    "framework_bench.plugins.Backend": Moved(_REGISTRY, "0.3.0", name="RegisteredBackend"),  # a plugin's base
    **{f"framework_bench.plugins.{name}": Moved(_REGISTRY, "0.3.0")  # class is plugins.base.Backend
       for name in ("UnknownBackend", "get", "backends", "manager", "load_errors", "origins", "HOOKS")},
    **{f"framework_bench.envs.{name}": Moved(f"framework_bench.envs.{module}", "0.3.0")
       for module, names in _ENVS.items() for name in names},
}


def _warn(old: str, new: str, moved: Moved, stacklevel: int) -> None:
    note = f" ({moved.note})" if moved.note else ""
    warnings.warn(f"{old} moved to {new}{note}; the old path is removed in {moved.removal}", DeprecationWarning,
                  stacklevel=stacklevel + 1)


def attribute(package: str, name: str):
    """`package.name` where it is a deprecated attribute, warning; else the AttributeError a
    package's `__getattr__` raises (after which the import system tries a submodule)."""
    moved = ATTRIBUTES.get(f"{package}.{name}")
    if moved is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    _warn(f"{package}.{name}", f"{moved.home}.{moved.name or name}", moved, stacklevel=3)  # the package's caller
    return getattr(importlib.import_module(moved.home), moved.name or name)


class _OldModules:
    """Meta path finder and loader of `MODULES`: an old path imports its home module itself
    (or, for one split in parts, a module of all their names), so the objects are the same."""

    def find_spec(self, fullname, path=None, target=None):
        return ModuleSpec(fullname, self) if fullname in MODULES else None

    def create_module(self, spec):
        return None  # the default module, replaced in exec_module

    def exec_module(self, module):
        moved = MODULES[module.__name__]
        _warn(module.__name__, moved.home, moved, stacklevel=2)  # the importer (importlib's frames are skipped)
        home = importlib.import_module(moved.home)
        if not moved.also:
            sys.modules[module.__name__] = home  # what the import statement returns and binds
            return
        for part in (*moved.also, moved.home):
            source, _, name = part.partition(":")
            names = vars(importlib.import_module(source))
            module.__dict__.update({name: names[name]} if name else
                                   {k: v for k, v in names.items() if not k.startswith("__")})


_FINDER = _OldModules()


def install() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)  # last: every other import is found before it is asked
