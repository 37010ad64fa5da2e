"""Every deprecated name of fbench, with the release that removes it (CONTRIBUTING.md,
"Compatibility policy").

A name that moves keeps its old path for one minor release: importing it gives the very same
objects and warns (DeprecationWarning) naming the new home and the removal release; at that
release its entry here goes, and with it the path. Old module paths are served by the import
hook below (`install`, called by `framework_bench/__init__.py`).

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


# Old module path -> its home now. `spec/` was renamed `scenario/` in 0.3.0 (the scenario model is
# the core, and "spec" reads as test data); every entry of 0.2.0 went with 0.3.0.
_SPEC_MODULES = ("catalog", "fields", "finetune", "models", "places", "scenario")
MODULES = {
    "framework_bench.spec": Moved("framework_bench.scenario", "0.4.0"),
    **{f"framework_bench.spec.{name}": Moved(f"framework_bench.scenario.{name}", "0.4.0") for name in _SPEC_MODULES},
}


class _OldModules:
    """Meta path finder and loader of `MODULES`: an old path imports its home module itself, so
    the objects are the same."""

    def find_spec(self, fullname, path=None, target=None):
        return ModuleSpec(fullname, self) if fullname in MODULES else None

    def create_module(self, spec):
        return None  # the default module, replaced in exec_module

    def exec_module(self, module):
        moved = MODULES[module.__name__]
        warnings.warn(f"{module.__name__} moved to {moved.home}; the old path is removed in {moved.removal}",
                      DeprecationWarning, stacklevel=2)  # the importer (importlib's frames are skipped)
        sys.modules[module.__name__] = importlib.import_module(moved.home)  # what the import binds


_FINDER = _OldModules()


def install() -> None:
    # First: an old package path aliases its home package, whose __path__ would let the path finder
    # load a second copy of each old submodule (other objects, no warning).
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
