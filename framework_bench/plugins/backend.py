"""Moved to `framework_bench.plugins.contract`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.plugins.backend moved to framework_bench.plugins.contract", DeprecationWarning,
              stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.plugins.contract")).items()
                  if not k.startswith('__')})
