"""Each backend's own venv: where it lives and whether it is ready (`venvs`), how it is made
(`creation`, `pip_options`, `torch_index`, `smoke`, `sdk_check`, `host_packages`), and the
layering over a venv host (`site_layers`, standard library only).

`framework_bench.envs` was once a module of its own; its names are kept for code written against
it until their removal release (`framework_bench._compat.ATTRIBUTES`, which names each one's
submodule), each warning (DeprecationWarning) with its new home on first use.
"""

from framework_bench import _compat


def __getattr__(name: str):
    # Only the table's names are looked up: `from framework_bench.envs import site_layers` asks here
    # first and never imports pydantic (the GPU device install runs it with the standard library only).
    return _compat.attribute(__name__, name)
