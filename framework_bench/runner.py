"""Moved to `framework_bench.run.pipeline` (dry runs: `framework_bench.run.dry_run`); this name is kept
for code written against it."""

import importlib
import warnings

warnings.warn("framework_bench.runner moved to framework_bench.run.pipeline (dry runs: framework_bench.run.dry_run)",
              DeprecationWarning, stacklevel=2)
for _home in ("framework_bench.run.dry_run", "framework_bench.run.pipeline"):  # the pipeline's names win
    globals().update({k: v for k, v in vars(importlib.import_module(_home)).items() if not k.startswith('__')})
