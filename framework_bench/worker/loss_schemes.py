"""The names of the loss normalisations: what a plain loop can be asked to take
(`Job.loss_scheme`, `losses.loss_divisors`) and how the host names a run's weighting
(framework_bench/measure/losses.py). Stdlib only: the job's schema reads them on the host.
"""

from __future__ import annotations

from typing import Literal, get_args

LossScheme = Literal["step_token_mean", "step_label_mean", "micro_mean_mean"]
SCHEMES: tuple[LossScheme, ...] = get_args(LossScheme)
# step_token_mean: the step's summed token loss / its supervised tokens (on the rank);
# step_label_mean: the same over labels counted before the shift (HF num_items_in_batch);
# micro_mean_mean: each micro-batch's token mean / the micro-batches in the step.
STEP_TOKEN_MEAN, STEP_LABEL_MEAN, MICRO_MEAN_MEAN = SCHEMES
