"""The names of the loss normalisations: what a plain loop can be asked to take
(`Job.loss_scheme`, `losses.loss_divisors`) and how the host names a run's weighting
(framework_bench/measure/losses.py); and `JudgingLoss`, the loss a reference run that judges
another is asked to train. Stdlib only: the job's schema reads them on the host.
"""

from __future__ import annotations

from dataclasses import dataclass
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
# The settings key a run claims its rows' labels rolled with (ms-swift's sequence parallel; `Job.labels_rolled`).
ROLLED = "labels_rolled"


@dataclass(frozen=True)
class JudgingLoss:
    """The loss a reference run trains to judge a run whose loss differs from the reference's own:
    the run's normalisation (`Job.loss_scheme`), and its labels rolled instead of shifted
    (`Job.labels_rolled`); the default, the reference's own. `key` names it among a SLURM round's
    judging runs ('' for the reference's own)."""

    scheme: LossScheme | None = None
    rolled: bool = False

    @property
    def key(self) -> str:
        return "+".join(p for p in (self.scheme, ROLLED if self.rolled else None) if p)

    def said(self) -> str:
        return "; ".join(p for p in (self.scheme and f"loss_scheme {self.scheme}",
                                     self.rolled and "rolled labels") if p)
