"""Each backend's own venv (`venvs`) and the layering over a venv host (`site_layers`).

`framework_bench.envs` was once the `venvs` module itself; its names are kept here for code written
against it, each warning (DeprecationWarning) with its new home on first use.
"""

import importlib
import types
import warnings


SUBMODULES = ("venvs", "site_layers")


def __getattr__(name: str):
    if name in SUBMODULES:  # `from framework_bench.envs import site_layers` asks here first: never import venvs
        raise AttributeError(name)  # for it (pydantic), the device check's install has only the stdlib
    venvs = importlib.import_module("framework_bench.envs.venvs")
    value = getattr(venvs, name, None) if not name.startswith("_") else None
    if value is None or isinstance(value, types.ModuleType):  # a submodule not imported yet: the import system's
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"framework_bench.envs.{name} moved to framework_bench.envs.venvs.{name}", DeprecationWarning,
                  stacklevel=2)
    return value
