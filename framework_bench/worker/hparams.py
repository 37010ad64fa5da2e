"""The optimizer settings every backend uses, so that only the framework differs."""

from __future__ import annotations

LEARNING_RATE = 2e-5
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
WEIGHT_DECAY = 0.0
MAX_GRAD_NORM = 1.0
SEED = 1024  # the seed XTuner's published configs use; one per compare (`--seed`): initial weights, framework seeding
