"""Sequence-parallel runs on LLaMA-Factory's v1 trainer (FSDP2 + Ulysses), worker side.

Mirrors `llamafactory.v1.trainers.sft_trainer.run_sft`, with two additions it has no
argument for: the step-metrics callback, and a pass-through for rows that are already
tokenized (the v1 renderer otherwise expects chat messages). Needs a GPU and flash-attn,
which `fbench_check` requires before planning such a run; not runnable on a CPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.packed import IGNORE_INDEX, PackedRows

from fbench_llamafactory import run_files
from fbench_llamafactory.run_files import is_local_main, wait_for
from fbench_llamafactory.step_metrics import StepRecorder


def write_parquet(packed: PackedRows, rows: int, target: Path) -> None:
    """The first `rows` packed rows as one parquet file (the v1 data engine reads local files;
    its sampler shuffles them, so the order differs from the v0 trainer's, the rows do not)."""
    if is_local_main():
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"input_ids": packed.input_ids[:rows].tolist(), "labels": packed.labels[:rows].tolist()})
        tmp = target.with_name(target.name + ".tmp")
        pq.write_table(table, tmp)
        tmp.rename(target)
    else:
        wait_for(target)


def write_random_weights(model_dir: Path) -> None:
    """The v1 model engine always calls `from_pretrained`: save a random-initialised model first."""
    done = model_dir / ".random-weights-written"
    if is_local_main():
        from transformers import AutoConfig, AutoModelForCausalLM

        if not done.exists():
            AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir)).save_pretrained(model_dir)
            done.touch()
    else:
        wait_for(done)


def pretokenized(samples: list[dict]) -> list[dict]:
    """Collate step for rows that are already token ids: loss where labels are set, plain positions."""
    out = []
    for s in samples:
        n = len(s["input_ids"])
        out.append({
            "input_ids": s["input_ids"],
            "attention_mask": [1] * n,
            "labels": s["labels"],
            "loss_weights": [0.0 if t == IGNORE_INDEX else 1.0 for t in s["labels"]],
            "position_ids": list(range(n)),
        })
    return out


def train_v1(job: dict, packed: PackedRows, rows: int, recorder: StepRecorder) -> None:
    from llamafactory.v1.accelerator.interface import DistributedInterface
    from llamafactory.v1.config import get_args
    from llamafactory.v1.core.data_engine import DataEngine
    from llamafactory.v1.core.model_engine import ModelEngine
    from llamafactory.v1.trainers.sft_trainer import SFTTrainer
    from llamafactory.v1.utils.callbacks import TrainerCallback

    class V1StepMetrics(TrainerCallback):
        def on_train_begin(self, args, state, model=None, **kwargs):
            recorder.attach(model)

        def on_step_begin(self, args, state, **kwargs):
            recorder.begin()

        def on_step_end(self, args, state, **kwargs):
            recorder.end()

        def on_log(self, args, state, logs, **kwargs):
            if "loss" in logs:
                recorder.loss(logs["loss"])

    run_dir = Path(job["run_dir"])
    args = json.loads(run_files.args_file(run_dir, job["scenario"]["sequence_parallel"]).read_text())
    model_args, data_args, training_args, _ = get_args(args)
    write_parquet(packed, rows, Path(data_args.train_dataset))
    write_random_weights(Path(model_args.model))
    DistributedInterface(training_args.dist_config)
    model_engine = ModelEngine(model_args, is_train=True)
    model_engine.renderer.process_samples = pretokenized
    trainer = SFTTrainer(
        args=training_args,
        model=model_engine.model,
        renderer=model_engine.renderer,
        train_dataset=DataEngine(data_args.train_dataset),
        callbacks=[V1StepMetrics()],
    )
    trainer.fit()
    DistributedInterface().destroy()
