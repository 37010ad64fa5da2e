"""The plugin contract (see CONTRIBUTING.md, "What a plugin may import").

`framework_bench.plugins` was once the registry module itself; its names are kept for code written
against it until their removal release (`framework_bench._compat.ATTRIBUTES`), each warning
(DeprecationWarning) with its new home on first use.
"""

from framework_bench import _compat


def __getattr__(name: str):
    return _compat.attribute(__name__, name)  # else AttributeError: a submodule not imported yet is the import system's
