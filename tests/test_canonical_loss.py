"""The canonical loss per optimizer step (issue 20, item 3): the host restates each
framework's micro-batch losses as the token mean over the step, whatever each divided by."""

from __future__ import annotations

import json
import math

import pytest

from framework_bench.measure.losses import canonical_losses


def write(run_dir, rank, records):
    (run_dir / "losses").mkdir(exist_ok=True)
    (run_dir / "losses" / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_three_normalisations_of_one_step_give_one_token_mean(tmp_path):
    # Two micro-batches with summed token losses 30 and 10 over 6 and 2 supervised tokens
    # (after the shift): the step's token mean is 40 / 8 = 5.
    ways = {
        # XTuner: each micro-batch's own mean
        "mean_per_micro": [(30 / 6, 6), (10 / 2, 2)],
        # the torch loop: the step's summed loss over the step's count
        "token_mean_step": [(30 / 8, 8), (10 / 8, 8)],
        # HF Trainer: over labels counted before the shift (one more per row starting mid-answer)
        "before_shift": [(30 / 9, 9), (10 / 9, 9)],
    }
    for name, micro in ways.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        write(run_dir, 0, [{"step": 1, "micro": i, "loss": loss, "divisor": div, "supervised": sup}
                           for i, ((loss, div), sup) in enumerate(zip(micro, (6, 2)))])
        assert canonical_losses(run_dir) == {1: pytest.approx(5.0)}, name


def test_ranks_add_up_and_a_micro_batch_without_labels_adds_nothing(tmp_path):
    write(tmp_path, 0, [{"step": 1, "micro": 0, "loss": 2.0, "divisor": 4, "supervised": 4},
                        {"step": 2, "micro": 0, "loss": 1.0, "divisor": 3, "supervised": 3}])
    write(tmp_path, 1, [{"step": 1, "micro": 0, "loss": 4.0, "divisor": 4, "supervised": 4},
                        {"step": 2, "micro": 0, "loss": math.nan, "divisor": 0, "supervised": 0}])
    assert canonical_losses(tmp_path) == {1: pytest.approx(3.0), 2: pytest.approx(1.0)}
    assert canonical_losses(tmp_path / "nothing") == {} and canonical_losses(None) == {}
