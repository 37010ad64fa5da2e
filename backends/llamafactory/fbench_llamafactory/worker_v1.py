"""Sequence-parallel runs on LLaMA-Factory's v1 trainer (FSDP2 + Ulysses), worker side.

Mirrors `llamafactory.v1.trainers.sft_trainer.run_sft`, with two additions it has no
argument for: the step-metrics callback, and a pass-through for rows that are already
tokenized (the v1 renderer otherwise expects chat messages); and the model is built from its
config (`config_model_engine`), never from weight files. Needs a GPU and flash-attn,
which `fbench_check` requires before planning such a run; not runnable on a CPU machine.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.worker import Job, publish_once
from framework_bench.worker.packed import IGNORE_INDEX, PackedRows

from fbench_llamafactory import run_files
from fbench_llamafactory.run_files import V1_INIT
from framework_bench.worker.hf_trainer import StepRecorder


def write_parquet(packed: PackedRows, rows: int, target: Path) -> None:
    """The first `rows` packed rows as one parquet file (the v1 data engine reads local files;
    its sampler shuffles them, so the order differs from the v0 trainer's, the rows do not).
    One process writes it, whatever the number of nodes sharing the run folder."""

    def write(tmp: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"input_ids": packed.input_ids[:rows].tolist(), "labels": packed.labels[:rows].tolist()})
        pq.write_table(table, tmp)

    publish_once(target, write)


def config_model_engine():
    """LLaMA-Factory's `ModelEngine`, building the model from its config instead of loading
    weights: the v1 engine's `init_on_rank0` calls `from_pretrained` on global rank 0, which
    would need the full random weights written to disk (~27 GB fp32 for 7B, more than a
    disk for 70B). Here rank 0 builds the random-initialised model in host memory and every
    other rank builds it on the meta device, as `init_on_rank0` places them; FSDP2 then
    shards it and broadcasts rank 0's weights (fsdp2.py `shard_model`). No GPU ever holds
    the full model; rank 0's host holds it in fp32 (plus LLaMA-Factory's copy for the broadcast)."""
    import torch
    from accelerate import init_empty_weights
    from llamafactory.v1.accelerator.interface import DistributedInterface
    from llamafactory.v1.core.model_engine import ModelEngine
    from transformers import AutoModelForCausalLM

    class ConfigModelEngine(ModelEngine):
        def _init_model(self):
            mode = self.args.init_config.name if self.args.init_config is not None else None
            if mode != V1_INIT:
                raise RuntimeError(f"the fbench v1 plan asks for init_config {V1_INIT!r}, not {mode!r}")
            kwargs = {"attn_implementation": self.args.flash_attn}
            if DistributedInterface().get_rank() == 0:
                model = AutoModelForCausalLM.from_config(self.model_config, **kwargs)
            else:
                with init_empty_weights():
                    model = AutoModelForCausalLM.from_config(self.model_config, **kwargs)
            model._init_mode = V1_INIT  # what LLaMA-Factory's engine records, read by its FSDP2 plugin
            return model.to(torch.float32)  # as the engine does for full fine-tuning

    return ConfigModelEngine


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


def train_v1(job: Job, packed: PackedRows, rows: int, recorder: StepRecorder) -> None:
    from llamafactory.v1.accelerator.interface import DistributedInterface
    from llamafactory.v1.config import get_args
    from llamafactory.v1.core.data_engine import DataEngine
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

    args = json.loads(run_files.args_file(job.run_dir, job.scenario.sequence_parallel).read_text())
    model_args, data_args, training_args, _ = get_args(args)
    write_parquet(packed, rows, Path(data_args.train_dataset))
    DistributedInterface(training_args.dist_config)
    model_engine = config_model_engine()(model_args, is_train=True)
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
