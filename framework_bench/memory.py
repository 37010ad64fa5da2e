"""Moved to `framework_bench.measure.memory` (a plugin's `MemoryScheme`: `framework_bench.plugins.contract`);
this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.memory moved to framework_bench.measure.memory", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.measure.memory")).items()
                  if not k.startswith('__')})
