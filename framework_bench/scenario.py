"""Moved to `framework_bench.spec.scenario`; this name is kept for plugins written against it."""

import importlib
import warnings

warnings.warn("framework_bench.scenario moved to framework_bench.spec.scenario", DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.spec.scenario")).items()
                  if not k.startswith('__')})
