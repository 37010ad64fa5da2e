import sys

import torch

from framework_bench.worker import ADAM_BETAS, ADAM_EPS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY
from framework_bench.worker import Report, StepLog, initial_weights_worker, load_job, settings, supervised_after_shift
from framework_bench.worker import update, write_report
from framework_bench.worker.models import from_config


def main(job_file: str) -> None:
    job = load_job(job_file)                     # the host's Job, typed
    rows = job.open_rows()                       # the host's packed stream: train on it, verified
    model = from_config(job, torch.device("cpu"), attn_implementation="sdpa")  # the seed's random weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=ADAM_BETAS,
                                  eps=ADAM_EPS, weight_decay=WEIGHT_DECAY)
    log = StepLog(job, rank=0)                   # clock, tokens, losses, rows fed: the host checks them
    initial_weights_worker.fill_revealed(model, job, log.timer.clock, optimizer)  # from the seed revealed now
    for step, [(ids, labels)] in enumerate(job.batches(rows, rank=0, world=1), start=1):
        log.begin(step)                          # the step's clock and memory window start
        loss = model(input_ids=torch.from_numpy(ids), labels=torch.from_numpy(labels)).loss
        loss.backward()                          # HF: the mean over the labels after the shift
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
        optimizer.step()
        optimizer.zero_grad()
        log.micro(ids, labels, loss, max(supervised_after_shift(labels), 1), scale=1)  # backpropagated as it is
        log.end(step)                            # writes metrics/rank0.jsonl, then the rows and losses
    log.close()
    update.report(model, job)                    # (final - initial) weights onto the vector revealed now
    write_report(job, Report(
        framework_version=torch.__version__, attention_used=model.config._attn_implementation,
        param_count=settings.param_count(model), throughput=log.throughput(),
        settings=settings.torch_loop_settings(model, optimizer, trainer="minimal-loop", grad_clip=MAX_GRAD_NORM,
                                              loss_normalization="token mean per micro-batch (HF)")))


if __name__ == "__main__":
    main(sys.argv[1])
