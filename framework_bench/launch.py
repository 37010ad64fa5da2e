"""Its plan-environment helpers (`cuda_allocator_env`, `visible_gpus_env`, `process_group_env`) moved to
`framework_bench.plugins.plan_env`, the launchers to `framework_bench.run.launchers`; this name is kept for
plugins written against it, with the helpers a plugin used."""

import importlib
import warnings

warnings.warn("framework_bench.launch moved to framework_bench.plugins.plan_env (launchers: framework_bench.run.launchers)",
              DeprecationWarning, stacklevel=2)
globals().update({k: v for k, v in vars(importlib.import_module("framework_bench.plugins.plan_env")).items()
                  if not k.startswith('__')})
