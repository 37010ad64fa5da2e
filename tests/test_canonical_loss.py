"""The canonical loss per optimizer step: the host restates each
framework's micro-batch losses as the token mean over the step, whatever each divided by."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from framework_bench.measure.losses import canonical_losses
from framework_bench.worker.loss_weighting import scheme
from framework_bench.worker.losses import loss_divisors


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


def micro(step, i, supervised, labelled, divisor, scale=None, loss=5.0):
    record = {"step": step, "micro": i, "loss": loss, "divisor": divisor, "supervised": supervised, "labelled": labelled}
    return record if scale is None else {**record, "scale": scale}


# Two steps of two micro-batches: supervised tokens after the shift (labels before it).
COUNTS = [((300, 301), (211, 212)), ((511, 512), (0, 1))]


def scheme_of(tmp_path, name, records_of_step):
    run_dir = tmp_path / name
    run_dir.mkdir()
    write(run_dir, 0, [r for step, counts in enumerate(COUNTS, start=1) for r in records_of_step(step, counts)])
    return scheme(run_dir)


def test_the_normalisation_is_read_from_the_divisors_and_scales_exactly(tmp_path):
    """What each framework divided by and scaled by before backward names how its
    tokens weighed, whatever its `loss_normalization` wording says."""
    def torch_loop(step, counts):  # the model's loss over the step's count, backpropagated as it is
        total = sum(s for s, _ in counts)
        return [micro(step, i, s, l, total, 1.0) for i, (s, l) in enumerate(counts)]

    def xtuner(step, counts):  # each micro-batch's mean, divided by the accumulation by mmengine
        return [micro(step, i, s, l, s, 0.5) for i, (s, l) in enumerate(counts)]

    def hf_trainer(step, counts):  # num_items_in_batch: labels counted before the shift
        total = sum(l for _, l in counts)
        return [micro(step, i, s, l, total, 1.0) for i, (s, l) in enumerate(counts)]

    assert scheme_of(tmp_path, "torch", torch_loop) == "step_token_mean"
    assert scheme_of(tmp_path, "xtuner", xtuner) == "micro_mean_mean"
    assert scheme_of(tmp_path, "hf", hf_trainer) == "step_label_mean"
    # the same arithmetic worded otherwise: one scheme; one token off in one micro-batch: not it
    assert scheme_of(tmp_path, "torch_words", lambda st, c: [{**r, "divisor": r["divisor"] * 2, "scale": 2.0}
                                                            for r in torch_loop(st, c)]) == "step_token_mean"
    assert scheme_of(tmp_path, "off_by_one", lambda st, c: [{**r, "divisor": r["divisor"] + (st == 2)}
                                                           for r in torch_loop(st, c)]) == "other"
    # a micro-batch the framework scaled by 0 (dropped from the gradient) is no scheme either
    assert scheme_of(tmp_path, "dropped", lambda st, c: [{**r, "scale": float(r["micro"] == 0)}
                                                        for r in torch_loop(st, c)]) == "other"
    # records that do not say what was applied before backward (an older worker SDK): unknown
    assert scheme_of(tmp_path, "no_divisor", lambda st, c: [{**r, "divisor": 0} for r in torch_loop(st, c)]) == "other"
    assert scheme_of(tmp_path, "old", lambda st, c: [{k: v for k, v in r.items() if k != "scale"}
                                                    for r in torch_loop(st, c)]) == "unknown"
    assert scheme(tmp_path / "nothing") == "unknown" and scheme(None) == "unknown"


def test_at_grad_accum_1_a_micro_batch_mean_is_the_step_token_mean(tmp_path):
    one = [((300, 300),), ((511, 511),)]
    for name, (divisor, scale) in {"torch": ("step", 1.0), "xtuner": ("micro", 1.0), "hf": ("labels", 1.0)}.items():
        run_dir = tmp_path / name
        run_dir.mkdir()
        write(run_dir, 0, [micro(step, 0, s, l, {"labels": l}.get(divisor, s), scale)
                           for step, ((s, l),) in enumerate(one, start=1)])
        assert scheme(run_dir) == "step_token_mean", name


def test_every_rank_s_labels_with_the_loss_times_the_ranks_is_world_label_mean(tmp_path):
    """HF Trainer's average_tokens_across_devices: each rank divides by the labels of every rank
    (before the shift) and multiplies the loss by the ranks, recorded as divisor labels / ranks.
    A single rank doing so is step_label_mean; ranks with equal counts are step_label_mean too."""
    ranks = {0: COUNTS, 1: [((100, 101), (50, 52)), ((7, 8), (40, 41))]}

    def hf_world(run_dir, ranks, off=0):
        run_dir.mkdir()
        for rank, counts in ranks.items():
            world = {step: sum(l for c in ranks.values() for _, l in c[step - 1]) for step in (1, 2)}
            write(run_dir, rank, [micro(step, i, s, l, world[step] / len(ranks) + off * (rank == 1), 1.0)
                                  for step, c in enumerate(counts, start=1) for i, (s, l) in enumerate(c)])
        return scheme(run_dir)

    assert hf_world(tmp_path / "two", ranks) == "world_label_mean"
    assert hf_world(tmp_path / "one", {0: COUNTS}) == "step_label_mean"
    assert hf_world(tmp_path / "equal", {0: COUNTS, 1: COUNTS}) == "step_label_mean"
    assert hf_world(tmp_path / "off", ranks, off=1) == "other"


def test_the_torch_loop_divides_by_every_rank_s_labels_over_the_ranks_for_world_label_mean():
    """The reference's num_items_in_batch: the step's labels before the shift summed over the
    ranks (`over_ranks`), over the ranks, so the model's loss is HF's times the ranks."""
    labels = [np.array([[-100, 1, 2, 3]]), np.array([[-100, -100, 5, 6]])]
    assert loss_divisors("step_label_mean", labels) == [5, 5]
    assert loss_divisors("world_label_mean", labels, lambda n: (n + 7, 2)) == [6.0, 6.0]
    assert loss_divisors("world_label_mean", labels) == [5.0, 5.0]  # outside a process group
