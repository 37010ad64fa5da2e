"""Each backend's own venv: where it lives and whether it is ready (`venvs`), how it is made
(`creation`, `pip_options`, `torch_index`, `smoke`, `sdk_check`, `host_packages`), and the
layering over a venv host (`site_layers`, standard library only).

`framework_bench.envs` was once a module of its own; its names are kept here for code written
against it, each warning (DeprecationWarning) with its new home on first use.
"""

import importlib
import warnings

# The former module's names, by the submodule that holds each now. Only these are looked up:
# `from framework_bench.envs import site_layers` never imports pydantic (the GPU device install
# runs it with the standard library only).
MOVED = {
    "EnvError": "errors",
    **dict.fromkeys(("RECORD", "STALE_PLUGIN", "Flavour", "FLAVOURS", "fbench_home", "env_path", "inspect",
                     "installed_versions"), "venvs"),
    **dict.fromkeys(("TORCH_INDEXES", "default_flavour", "driver_cuda_version", "parse_driver_cuda",
                     "torch_index_for"), "torch_index"),
    **dict.fromkeys(("OPTIONAL_IMPORTS", "SMOKE_TEST", "smoke_test"), "smoke"),
    **dict.fromkeys(("SDK_REQUIREMENTS", "SDK_IMPORT", "sdk_missing", "sdk_import_error"), "sdk_check"),
    **dict.fromkeys(("PTH_NAME", "COPY_MARK", "source_sha256"), "host_packages"),
    **dict.fromkeys(("Options", "pip_argv", "validate"), "pip_options"),
    **dict.fromkeys(("create", "sweep_building"), "creation"),
}


def __getattr__(name: str):
    if name not in MOVED:  # a submodule not imported yet comes here first: the import system's
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = f"{__name__}.{MOVED[name]}"
    warnings.warn(f"{__name__}.{name} moved to {home}.{name}", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module(home), name)
