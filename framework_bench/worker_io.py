"""Moved to `framework_bench.worker.files`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.worker_io moved to framework_bench.worker.files", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.worker.files")).items()
                  if not k.startswith('__')})
