"""Moved to `framework_bench.worker.initial_weights_worker`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.worker.init_weights moved to framework_bench.worker.initial_weights_worker",
              DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.worker.initial_weights_worker")).items()
                  if not k.startswith('__')})
