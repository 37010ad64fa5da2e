"""Moved to `framework_bench.worker.packed`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.packed moved to framework_bench.worker.packed", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.worker.packed")).items()
                  if not k.startswith('__')})
