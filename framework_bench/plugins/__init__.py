"""The plugin contract (see CONTRIBUTING.md, "What a plugin may import").

`framework_bench.plugins` was once the registry module itself; its names are kept here for code
written against it, each warning (DeprecationWarning) with its new home on first use.
"""

import importlib
import warnings

# Old name -> its home in `framework_bench.plugins.registry` (`Backend` was the registered
# backend's adapter, now `RegisteredBackend`; a plugin's base class is `plugins.base.Backend`).
_MOVED = {"Backend": "RegisteredBackend", "UnknownBackend": "UnknownBackend", "get": "get", "backends": "backends",
          "manager": "manager", "load_errors": "load_errors", "origins": "origins", "HOOKS": "HOOKS"}


def __getattr__(name: str):
    if name not in _MOVED:  # a submodule not imported yet: the import system takes over
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    new = f"framework_bench.plugins.registry.{_MOVED[name]}"
    warnings.warn(f"framework_bench.plugins.{name} moved to {new}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("framework_bench.plugins.registry"), _MOVED[name])
