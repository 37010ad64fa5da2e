"""Moved to `framework_bench.plugins.hookspecs`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.hookspecs moved to framework_bench.plugins.hookspecs", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.plugins.hookspecs")).items()
                  if not k.startswith('__')})
