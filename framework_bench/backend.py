"""Moved to `framework_bench.plugins.backend`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.backend moved to framework_bench.plugins.backend", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.plugins.backend")).items()
                  if not k.startswith('__')})
