"""The names of the loss normalisations: what a plain loop can be asked to take
(`Job.loss_scheme`, `losses.loss_divisors`) and how the host names a run's weighting
(framework_bench/measure/losses.py). Stdlib only: the job's schema reads them on the host.
"""

from __future__ import annotations

from typing import Literal, get_args

LossScheme = Literal["step_token_mean", "step_label_mean", "micro_mean_mean", "world_label_mean"]
SCHEMES: tuple[LossScheme, ...] = get_args(LossScheme)
# step_token_mean: the step's summed token loss / its supervised tokens (on the rank);
# step_label_mean: the same over labels counted before the shift (HF num_items_in_batch);
# micro_mean_mean: each micro-batch's token mean / the micro-batches in the step;
# world_label_mean: the step's summed token loss / its labels counted before the shift on every
# data-parallel rank, times the ranks, so the ranks' gradient average is the step's global
# label mean (HF Trainer's average_tokens_across_devices on several processes).
STEP_TOKEN_MEAN, STEP_LABEL_MEAN, MICRO_MEAN_MEAN, WORLD_LABEL_MEAN = SCHEMES
