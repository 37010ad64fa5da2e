"""The LLaMA-Factory worker: `python -m fbench_llamafactory.worker RUN_DIR/job.json`.

Runs inside the backend's own env. Checks the packed data is the one the host named,
converts it to LLaMA-Factory's pre-tokenized format, trains with LLaMA-Factory's own
entry point, and writes the common metrics file and the worker report. Any failure
raises, so the process exits non-zero.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

from framework_bench.worker import Job, Report, StartupClock, dist_info, initial_weights_worker, exit_now, load_job, publish_once, write_report
from framework_bench.worker.hf_trainer import Claims, StepRecorder, step_metrics_callback
from framework_bench.worker.packed import PackedRows

from fbench_llamafactory import run_files


def position_ids(segments: np.ndarray) -> np.ndarray:
    """Positions restarting at 0 at each document start (what LLaMA-Factory's own packing writes)."""
    starts = np.flatnonzero(np.diff(segments, prepend=segments[0] - 1))
    offsets = np.repeat(starts, np.diff(np.append(starts, len(segments))))
    return np.arange(len(segments)) - offsets


def columns(packed: PackedRows, rows: int, varlen: bool) -> dict[str, list]:
    """input_ids / attention_mask / labels for the first `rows` rows; varlen adds segment ids and positions."""
    ids = np.asarray(packed.input_ids[:rows])
    cols = {"input_ids": ids.tolist(), "labels": np.asarray(packed.labels[:rows]).tolist()}
    if varlen:
        # neat_packing: attention_mask holds the document number 1..k, and positions restart
        # per document (flash-attn's varlen path finds the boundaries from them).
        segs = [packed.segment_ids(r) for r in range(rows)]
        cols["attention_mask"] = [s.tolist() for s in segs]
        cols["position_ids"] = [position_ids(s).tolist() for s in segs]
    else:
        # packed: all ones, attention crosses document boundaries (XTuner use_varlen_attn=False).
        cols["attention_mask"] = np.ones_like(ids).tolist()
    return cols


def write_tokenized(packed: PackedRows, rows: int, varlen: bool, target: Path) -> None:
    """`DatasetDict{"train"}` saved where `tokenized_path` points; one process writes, the others wait.

    Only the rows the run consumes are converted: the whole stream (verified by its sha256)
    can be far larger than a few steps need, and the conversion goes through Python lists.
    """

    def write(tmp: Path) -> None:
        from datasets import Dataset, DatasetDict

        DatasetDict({"train": Dataset.from_dict(columns(packed, rows, varlen))}).save_to_disk(str(tmp))

    publish_once(target, write)


# What the v1 trainer's runs do not claim (each run `unverified` for them, never invalid): it runs on GPUs with flash-attn only,
# so no recorder hooked into it could be proven on a CPU, and fbench hooks none; the runs
# are `unverified`, naming these. Its clock lines (the step timer) are claimed as on v0.
V1_UNCLAIMED = {claim: "not recorded on LLaMA-Factory's v1 trainer (sequence parallel, GPU and flash-attn only): "
                       "no CPU run can prove a recorder there, so none is claimed"
                for claim in ("rows", "settings", "parameters", "initial_weights", "initial_reveal", "update",
                              "warmup_update", "throughput")}


def build_where_trained(job: Job, startup: StartupClock) -> None:
    """LLaMA-Factory builds a from-scratch model with `AutoModelForCausalLM.from_config` on the
    CPU and the trainer copies it to the GPU afterwards: minutes for 7B, which the start-up
    column would charge to the framework. On a GPU run the same call runs here under this
    rank's CUDA device, so the random weights are made where they train (the arguments,
    dtype and initialisation are LLaMA-Factory's own). ZeRO-3 builds inside DeepSpeed's
    zero.Init, partitioned already: left alone. The call's seconds are the start-up's
    "model_build".

    QLoRA: LLaMA-Factory quantizes only in `from_pretrained`, with its own BitsAndBytesConfig
    (model/model_utils/quantization.py), and the model folder holds no weights. That call
    gets the random base, built as above and filled with the shared initial weights, as
    its state dict in place of weight files (`pretrained_model_name_or_path=None`), every
    argument LLaMA-Factory passed kept: transformers' bitsandbytes loader quantizes it as it
    would a checkpoint's tensors. The unquantized base is held once on the GPU first (a model
    that does not fit there unquantized, 70B in bf16, cannot run this way), then handed back."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from_config = AutoModelForCausalLM.from_config.__func__

    def build(cls, config, **kwargs):
        if job.device == "cuda" and not is_deepspeed_zero3_enabled():
            with torch.device("cuda", dist_info().local_rank):
                return from_config(cls, config, **kwargs)
        return from_config(cls, config, **kwargs)

    def timed_from_config(cls, config, **kwargs):
        startup.mark("framework_setup")
        model = build(cls, config, **kwargs)
        startup.mark("model_build")
        return model

    def quantized_from_random(cls, pretrained_model_name_or_path, *args, config, **kwargs):
        startup.mark("framework_setup")
        base = build(cls, config)
        # the values the 4-bit weights are quantized from
        initial_weights_worker.fill(base, job.seed, base.config.to_dict())
        # the concrete class's own loader: the auto class would look for files at the path first
        model = type(base).from_pretrained(None, *args, config=config, state_dict=base.state_dict(), **kwargs)
        del base
        if job.device == "cuda":
            torch.cuda.empty_cache()  # a load from weight files never holds the unquantized base on the GPU
        startup.mark("model_build")
        return model

    AutoModelForCausalLM.from_config = classmethod(timed_from_config)
    if job.scenario.finetune.method == "qlora":
        AutoModelForCausalLM.from_pretrained = classmethod(quantized_from_random)


def fill_after_adapters(job: Job, startup: StartupClock) -> None:
    """The shared initial weights, written once LLaMA-Factory's `init_adapter` (called by its
    `load_model` after building the model) has attached any LoRA adapters and cast the
    trainable weights, before the trainer, DDP or DeepSpeed sees the model: base and adapters
    alike (lora_A from the seed, lora_B zero). `fill` leaves 4-bit weights alone: their values
    were filled before quantization (`build_where_trained`)."""
    from llamafactory.model import loader

    init_adapter = loader.init_adapter

    def init_and_fill(config, model, *args, **kwargs):
        startup.mark("framework_setup")
        model = init_adapter(config, model, *args, **kwargs)
        initial_weights_worker.fill(model, job.seed, model.config.to_dict())
        startup.mark("model_build")
        return model

    loader.init_adapter = init_and_fill


def train_v0(job: Job, packed: PackedRows, rows: int, recorder: StepRecorder, claims: Claims,
             startup: StartupClock) -> None:
    """LLaMA-Factory's SFT trainer through its own entry point, `run_exp`."""
    from llamafactory.train.tuner import run_exp
    from transformers import Trainer

    # LLaMA-Factory's SFT workflow calls `trainer.save_model()` after training whatever
    # `save_strategy` says: for Llama2-7B under ZeRO-3 that is a full DeepSpeed checkpoint
    # (~100 GB) written after the measured steps. The benchmark keeps no weights.
    Trainer.save_model = lambda self, *args, **kwargs: None

    args = json.loads(run_files.args_file(job.run_dir, 1).read_text())
    write_tokenized(packed, rows, job.scenario.attention == "varlen", Path(args["tokenized_path"]))
    startup.mark("data")
    build_where_trained(job, startup)
    fill_after_adapters(job, startup)
    claims.remember_prepared()
    claims.record_losses()
    run_exp(args, callbacks=[step_metrics_callback(recorder, startup), claims.callback])


# What LLaMA-Factory trains with when no adapter setting is given (hparams/finetuning_args.py),
# named in a native run's notes; the ledger reads the values from the live model.
NATIVE_LORA = ("LLaMA-Factory's LoRA defaults: lora_rank 8, lora_alpha 2 x rank (16), lora_dropout 0, "
               "lora_target all (every linear module but the LM head), no rsLoRA or DoRA")


def finetune_notes(job: Job) -> list[str]:
    """What an adapter run's report says about settings the scenario did not choose."""
    f = job.scenario.finetune
    notes = [f"native {f.method}: {NATIVE_LORA}"] if f.adapters and job.settings_mode == "native" else []
    if f.method == "qlora":
        notes.append("QLoRA base: random weights built from the config, then quantized by transformers' bitsandbytes "
                     "loader under LLaMA-Factory's own BitsAndBytesConfig (from_pretrained given the base as a state "
                     "dict, no weight files); the unquantized base is held once on the GPU before quantization, "
                     "then released")
    return notes


def main(job_file: str) -> None:
    startup = StartupClock(STARTED)
    job = load_job(job_file)
    scenario = job.scenario
    packed = job.open_rows()
    sp = scenario.sequence_parallel
    # Rows the trainer reads in order (no shuffling) across the data-parallel ranks.
    rows = min(packed.rows, job.rows_needed)
    recorder = StepRecorder(
        job.run_dir,
        device=job.device,
        require_flash_attn=sp > 1 or scenario.attention == "varlen",
        zero_stage=scenario.zero_stage,
    )
    claims = None
    if run_files.uses_v1_trainer(sp):
        from fbench_llamafactory.worker_v1 import train_v1

        train_v1(job, packed, rows, recorder)
    else:
        claims = Claims(job, recorder.timer.clock)
        train_v0(job, packed, rows, recorder, claims, startup)
    recorder.close()
    if recorder.steps_written != job.steps:
        raise SystemExit(f"LLaMA-Factory ran {recorder.steps_written} optimizer steps, expected {job.steps}")
    import transformers

    write_report(job, Report(
        framework_version=version("llamafactory"),
        attention_used=recorder.attention_used,
        settings={**claims.probe.settle(claims.settings), "loss_normalization": claims.normalization} if claims else None,
        param_count=claims.param_count if claims else None,
        startup_seconds=round(recorder.first_step_at - STARTED, 2),
        startup_breakdown=startup.phases if claims else None,
        notes=recorder.notes + finetune_notes(job),
        unclaimed={} if claims else V1_UNCLAIMED,
        extra={"rows_converted": rows, "transformers_version": transformers.__version__, "torch_version": version("torch"),
               "fbench_seconds_in_train_runtime": round(claims.fbench_seconds, 4) if claims else 0.0,
               "trainer": "v1 (FSDP2, Ulysses)" if run_files.uses_v1_trainer(sp) else "v0 (run_exp, HF Trainer)",
               "param_dtype": recorder.param_dtype, "zero_stage_in_effect": recorder.zero_stage},
    ))


if __name__ == "__main__":
    main(sys.argv[1])
    exit_now()  # the report is written: no second of interpreter teardown in every run
