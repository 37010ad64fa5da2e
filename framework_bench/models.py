"""Moved to `framework_bench.spec.models`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.models moved to framework_bench.spec.models", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.spec.models")).items()
                  if not k.startswith('__')})
