"""The worker SDK: what a backend's worker (running inside the backend's own env) builds on.

Stdlib + numpy at import time; torch is imported lazily inside the helpers that need it,
so the host can import this package too (it never calls the torch parts).
"""

from framework_bench.worker.dist import DistInfo, dist_info, sync
from framework_bench.worker.hparams import ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY
from framework_bench.worker.steps import PeakMemory, StepTimer

__all__ = ["ADAM_BETAS", "ADAM_EPS", "LEARNING_RATE", "MAX_GRAD_NORM", "WEIGHT_DECAY", "DistInfo", "PeakMemory",
           "StepTimer", "dist_info", "sync"]
