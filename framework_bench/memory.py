"""Moved to `framework_bench.measure.memory`, its `MemoryScheme` and `AdamWImpl` (a plugin's
declaration) to `framework_bench.plugins.contract`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.memory moved to framework_bench.measure.memory (MemoryScheme, AdamWImpl: "
              "framework_bench.plugins.contract)", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.measure.memory")).items()
                  if not k.startswith('__')})
from framework_bench.plugins.contract import AdamWImpl, MemoryScheme  # noqa: E402,F401 - the old module defined them
