"""Moved to `framework_bench.worker.initial_weights_host`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.worker.initial_weights moved to framework_bench.worker.initial_weights_host",
              DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.worker.initial_weights_host")).items()
                  if not k.startswith('__')})
