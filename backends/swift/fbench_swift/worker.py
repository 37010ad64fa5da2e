"""The ms-swift worker: `python -m fbench_swift.worker RUN_DIR/job.json`, in the swift env.

Runs ms-swift's own SFT pipeline (`SwiftSft`, what `swift sft` runs) with `SftArguments` as the
plugin wrote them (`swift_args`), on the host's packed rows saved as an ms-swift cached dataset.
Three hooks of the pipeline are fbench's: the model is ms-swift's dummy model (random weights
from the job's config) filled with the shared initial weights, the cached rows are used as
encoded (as `swift export --to_cached_dataset` leaves them), and the claims' callbacks join the
trainer. Any failure raises, so the process exits non-zero.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import json
import os
import sys
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

import numpy as np

from framework_bench.worker import Job, StartupClock, exit_now, initial_weights_worker, load_job, publish_once
from framework_bench.worker.hf_trainer import Claims, StepRecorder, step_metrics_callback, write_run_report
from framework_bench.worker.models import held_at_build

from fbench_swift.run_files import ROWS_DIR, RUN_FILE

# nothing is downloaded: a local model folder, the hub clients offline
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("USE_HF", "1")

# ms-swift 4.6 shifts the labels of a split row with torch.roll (swift/sequence_parallel/
# sequence_parallel.py:628), always: the row's last position is trained on its first label.
ROLLED_LABELS = ("ms-swift's sequence parallel shifts each row's labels by rolling them: where a packed row's first "
                 "label is supervised, the row's last position is trained to predict it, a target no other backend "
                 "trains (claimed as labels_rolled: judged against the reference trained with the same target)")
NATIVE_LORA = ("ms-swift's own LoRA defaults (TunerArguments): lora_rank 8, lora_alpha 32, lora_dropout 0.05, "
               "target_modules all-linear (every linear of the decoder, the LM head left out)")


def save_rows(job: Job, packed, rows: int) -> None:
    """The first `rows` of the `packed` rows as an ms-swift cached dataset (input_ids, labels, lengths),
    laid in the order ms-swift's sampler deals them over the data-parallel ranks (world / SP):
    `BatchSamplerShard` (or under sequence parallel `SequenceParallelSampler`, both ranks of a group
    alike) without shuffling gives data-parallel rank r the dataset's indices r, r + world, ...
    (swift/dataloader/shard.py:57, swift/sequence_parallel/utils.py:108), the host gives it
    micro-batch g rows [(g * world + r) * mb, ...). One process writes, the others wait."""
    world = job.data_parallel

    def write(tmp: Path) -> None:
        from datasets import Dataset

        mb = job.scenario.micro_batch
        order = np.empty(rows, dtype=np.int64)
        for j in range(rows // world):  # rank r's j-th row: micro-batch j // mb, place j % mb
            for r in range(world):
                order[r + j * world] = ((j // mb) * world + r) * mb + j % mb
        ids, labels = np.asarray(packed.input_ids[:rows])[order], np.asarray(packed.labels[:rows])[order]
        Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels.tolist(),
                           "lengths": [[ids.shape[1]]] * rows}).save_to_disk(str(tmp))

    publish_once(Path(job.run_dir) / ROWS_DIR, write)


@contextmanager
def partitioned_build():
    """Under ZeRO-3, the contexts transformers' `from_config` enters (no weight init, DeepSpeed's
    `zero.Init`): ms-swift's dummy model is `cls(config)`, which would otherwise stand whole on
    every rank before the engine partitions it. Yields whether it partitions: the caller ties the
    weights then, as `from_config` does, and `fill` writes every parameter."""
    from transformers import initialization
    from transformers.integrations.deepspeed import deepspeed_config, is_deepspeed_zero3_enabled
    from transformers.modeling_utils import set_zero3_state

    if not is_deepspeed_zero3_enabled():
        yield False
        return
    import deepspeed

    with (initialization.no_init_weights(), deepspeed.zero.Init(config_dict_or_path=deepspeed_config()),
          set_zero3_state()):
        yield True


def pipeline(job: Job, startup: StartupClock, claims: Claims, recorder: StepRecorder):
    """`SwiftSft` with fbench's three hooks (the model, the encoded rows, the callbacks)."""
    from swift.pipelines.train.sft import SwiftSft

    class FbenchSft(SwiftSft):
        def _prepare_model_tokenizer(self, **kwargs):
            # ms-swift's dummy model: `cls(config)` in the config's dtype, no weight files
            # (swift/model/patcher.py:477), then the shared initial weights
            with partitioned_build() as partitioned:
                super()._prepare_model_tokenizer(return_dummy_model=True, **kwargs)
            if partitioned:
                self.model.tie_weights()
            self.built = held_at_build(self.model, job.device)
            initial_weights_worker.fill(self.model, job.seed, job.hf_config)
            startup.mark("model_build")

        def _post_process_datasets(self, datasets):
            # the cached rows are encoded: no LazyLLMDataset re-encoding, no packing (as ms-swift's
            # own cached-dataset export, swift/pipelines/export/cached_dataset.py:31)
            return datasets

        def train(self, trainer):
            claims.record_losses(type(trainer), split_rows=job.scenario.sequence_parallel > 1)
            trainer.add_callback(step_metrics_callback(recorder, startup))
            trainer.add_callback(claims.callback)
            self.trainer = trainer
            return super().train(trainer)

    return FbenchSft


def sequence_parallel_settings(attention: str | None) -> dict:
    """What ms-swift's sequence parallel ran, from its live state: the group's size and the
    attention it wraps (Ulysses' all-to-all around it; ring attention where K/V heads run short)."""
    from swift.sequence_parallel import sequence_parallel

    if (sequence_parallel.world_size or 1) == 1:
        return {}
    kind = "ulysses" if sequence_parallel.rp_world_size == 1 else "ring"
    return {"sequence_parallel": sequence_parallel.world_size, "attention": f"{attention}_{kind}", "labels_rolled": True}


def main(job_file: str) -> None:
    startup = StartupClock(STARTED)
    job = load_job(job_file)
    from swift.arguments import SftArguments

    packed = job.open_rows()
    rows = min(packed.rows, job.rows_needed)
    save_rows(job, packed, rows)
    startup.mark("data")
    files = json.loads((Path(job.run_dir) / RUN_FILE).read_text())
    args = SftArguments(**files["sft_args"])
    recorder = StepRecorder(Path(job.run_dir), device=job.device, require_flash_attn=False,
                            zero_stage=job.scenario.zero_stage)
    claims = Claims(job, recorder.timer.clock)
    claims.remember_prepared()
    sft = pipeline(job, startup, claims, recorder)(args)
    result = sft.main()
    if job.scenario.sequence_parallel > 1:
        claims.settings.update(sequence_parallel_settings(claims.settings.get("attention")))
        recorder.notes.append(ROLLED_LABELS)
    runtime = float(next(log["train_runtime"] for log in reversed(result["log_history"]) if "train_runtime" in log))
    write_run_report(job, recorder, claims, startup, version("ms-swift"), runtime, NATIVE_LORA, rows_converted=rows,
                     built=sft.built)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_now()  # the report is written: no second of interpreter teardown in every run
