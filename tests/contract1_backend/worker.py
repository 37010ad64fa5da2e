# CONTRIBUTING.md's example worker as it stood in release 0.1.0 (dcebcb8), before the Backend base class,
# the companion of plugin.py here. Kept as written then below this comment but for its imports: 0.1.0's
# worker_io, packed and init_weights went in 0.3.0 (as 0.2.0 announced), so they name their homes, bound
# to the old names. A plugin of this form stays tested (tests/test_public_surface.py).
import sys
import time

import numpy as np
import torch
import transformers

from framework_bench.worker import ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY
from framework_bench.worker import ConsumedRows, StepTimer, dist_info, load_job, settings
from framework_bench.worker import files as worker_io
from framework_bench.worker import initial_weights_worker as init_weights
from framework_bench.worker.packed import PackedRows
from framework_bench.worker.losses import MicroLosses, supervised_after_shift


def main(job_file: str) -> None:
    job = load_job(job_file)                    # the host's Job, as JSON
    scenario, dist = job["scenario"], dist_info()
    rows = PackedRows(job["data_dir"])           # the host's packed stream: train on it, verified
    sha = rows.sha256()
    if sha != job["data_sha256"]:
        raise SystemExit(f"packed data has sha256 {sha}, the host expected {job['data_sha256']}")

    cfg = dict(job["hf_config"])                 # random weights from the scenario's config
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
    init_weights.fill(model, job["seed"], job["hf_config"])  # the seed's weights, as in every backend
    if scenario["activation_checkpointing"]:
        model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=ADAM_BETAS,
                                  eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)

    init_weights.report(model, job["seed"], job["run_dir"])  # sampled from the live model: the host checks
    timer = StepTimer(job["run_dir"], job["device"], rank=dist.rank)
    consumed = ConsumedRows(job["run_dir"], dist.rank)  # the rows each step fed: the host checks them
    losses = MicroLosses(job["run_dir"], dist.rank)      # the loss and its divisor: parity with torch
    mb, warmup = scenario["micro_batch"], scenario["steps"]["warmup"]
    for step in range(1, warmup + scenario["steps"]["measured"] + 1):
        if step == warmup + 1:                   # the loop's own clock over the measured steps
            started = time.perf_counter()
        lo = (step - 1) * mb                     # rows in order, as every backend reads them
        ids = torch.from_numpy(np.asarray(rows.input_ids[lo:lo + mb], dtype=np.int64))
        labels = torch.from_numpy(np.asarray(rows.labels[lo:lo + mb], dtype=np.int64))
        timer.begin()                            # the step's clock and memory window start
        loss = model(input_ids=ids, labels=labels).loss  # HF: the mean over the labels after the shift
        losses.add(loss, max(supervised_after_shift(labels), 1), labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        timer.end(step, loss.item(), tokens=ids.numel())  # writes metrics/rank<R>.jsonl
        consumed.add(ids, labels)                # recorded after the clock stopped
        consumed.end_step(step)
        losses.end_step(step)
    tokens_per_sec = scenario["steps"]["measured"] * ids.numel() / (time.perf_counter() - started)
    timer.close()
    consumed.close()
    losses.close()
    worker_io.write_worker_report(
        job["run_dir"], data_sha256=sha, framework_version=torch.__version__, param_count=settings.param_count(model),
        attention_used=model.config._attn_implementation, throughput={"tokens_per_sec": tokens_per_sec},
        settings=settings.torch_loop_settings(model, optimizer, trainer="minimal-loop", grad_clip=MAX_GRAD_NORM))


if __name__ == "__main__":
    main(sys.argv[1])
