"""Both real trainers (XTuner, LLaMA-Factory) on the smallest CPU scenario, the session's shared
runs (`tiny_cpu_run`): ok on the same packed data, and matched mode's equalities in the settings
each worker read off its live objects. (The CLI's compare of both real trainers, its rows,
charts and report: test_lora.py's, on tiny_cpu_lora.)"""

import math

import pytest


# What matched mode aligns (fairness audit rows 2, 3, 5, 7, 8, 9, 13, 15, 17, 19, 20 on CPU).
MATCHED_EQUAL = ("optimizer", "optimizer_impl", "lr", "betas", "eps", "weight_decay", "grad_clip", "param_dtype",
                 "autocast_dtype", "loss_scaler", "grad_reduce_dtype", "master_weights", "attention",
                 "activation_checkpointing", "checkpointing_reentrant", "zero_stage", "dataloader_workers",
                 "pin_memory", "shuffle", "seed", "compile", "sequence_parallel", "token_count_sync")


@pytest.mark.slow
def test_matched_mode_leaves_xtuner_and_llamafactory_alike_in_what_each_worker_read(tiny_cpu_run):
    runs = {b: tiny_cpu_run(b)[2] for b in ("xtuner", "llamafactory")}
    for r in runs.values():
        assert r.status == "ok", r.reason
        assert r.steps_measured == 5 and r.tgs > 0 and math.isfinite(r.final_loss)
        assert r.settings_mode == "matched"
    assert runs["xtuner"].data_sha256 == runs["llamafactory"].data_sha256
    xt, lf = runs["xtuner"].settings, runs["llamafactory"].settings
    for key in MATCHED_EQUAL:
        assert xt[key] == lf[key], (key, xt[key], lf[key])
    assert xt["trainer"] == "mmengine-runner" and lf["trainer"] == "hf-trainer"
    assert lf["token_count_sync"] is False  # fbench adds no sync on one side
