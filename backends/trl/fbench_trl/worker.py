"""The TRL worker: `python -m fbench_trl.worker RUN_DIR/job.json`, in the trl env.

Builds the model from the job's config (random weights, made where they train) and the
shared initial weights, as a TRL user hands `SFTTrainer` a model, then trains with TRL's own
`SFTTrainer` on the host's packed rows: `SFTConfig` as the plugin wrote it (`sft_args`; sequence
parallel through accelerate, `sequence_parallel`), LoRA through its `peft_config`, the claims
recorded by the SDK's HF Trainer side (`framework_bench.worker.hf_trainer`). Any failure raises,
so the process exits non-zero.
"""

from __future__ import annotations

import time

STARTED = time.time()  # before the heavy imports below: start-up counts them

import json
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np

from framework_bench.worker import Job, StartupClock, adapters, dist_info, exit_now, initial_weights_worker, load_job
from framework_bench.worker.hf_trainer import Claims, StepRecorder, step_metrics_callback, write_run_report
from framework_bench.worker.models import held_at_build
from framework_bench.worker.packed import TOKENIZER_DIR

from fbench_trl import sequence_parallel
from fbench_trl.run_files import RUN_FILE

# TRL has no adapter defaults of its own: its docs hand SFTTrainer a `peft.LoraConfig`, whose
# defaults a native run takes (the ledger reads the values from the live model).
NATIVE_LORA = ("TRL takes the adapters it is given: native LoRA is peft's LoraConfig defaults (r 8, lora_alpha 8, "
               "dropout 0, target_modules peft's per-model default: q_proj and v_proj for Llama)")


def dataset(packed, rows: int):
    """The first `rows` of the `packed` rows as a `datasets.Dataset` of input_ids and labels, the
    columns TRL's collator reads when its own preparation is skipped (labels used as given)."""
    from datasets import Dataset

    return Dataset.from_dict({"input_ids": np.asarray(packed.input_ids[:rows]).tolist(),
                              "labels": np.asarray(packed.labels[:rows]).tolist()})


def build_model(job: Job, attn_implementation: str):
    """The model from the job's config with random weights, made where it trains (a ZeRO-3 run
    builds partitioned inside DeepSpeed's zero.Init, which the SFTConfig made current), then filled
    with the shared initial weights; an adapter run's frozen base in the scenario's base dtype.
    With it, what this rank held once built (`held_at_build`)."""
    import torch
    import transformers
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    cfg = dict(job.hf_config)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    f = job.scenario.finetune
    dtype = getattr(torch, adapters.TORCH_DTYPES[f.base_dtype]) if f.adapters else torch.float32
    kwargs = {"attn_implementation": attn_implementation, "dtype": dtype}
    if job.device == "cuda" and not is_deepspeed_zero3_enabled():
        with torch.device("cuda", dist_info().local_rank):
            model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    built = held_at_build(model, job.device)
    initial_weights_worker.fill(model, job.seed, job.hf_config)
    return model, built


def peft_config(job: Job):
    """The scenario's adapters (matched) or peft's defaults (native); None for full fine-tuning."""
    f = job.scenario.finetune
    if not f.adapters:
        return None
    import peft

    if job.settings_mode == "native":
        return peft.LoraConfig(task_type="CAUSAL_LM")
    return peft.LoraConfig(**adapters.lora_config(f))


def main(job_file: str) -> None:
    startup = StartupClock(STARTED)
    job = load_job(job_file)
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    packed = job.open_rows()
    rows = min(packed.rows, job.rows_needed)
    train_rows = dataset(packed, rows)
    tokenizer = AutoTokenizer.from_pretrained(str(Path(job.data_dir) / TOKENIZER_DIR))
    startup.mark("data")
    files = json.loads((Path(job.run_dir) / RUN_FILE).read_text())
    # before the model: under ZeRO-3 it makes zero.Init current
    config = SFTConfig(**files["sft_config"],
                       parallelism_config=sequence_parallel.parallelism_config(files["parallelism_config"]))
    split = config.parallelism_config is not None  # each row split over an SP group by DeepSpeed's loader adapter
    recorder = StepRecorder(Path(job.run_dir), device=job.device, require_flash_attn=False,
                            zero_stage=job.scenario.zero_stage)
    claims = Claims(job, recorder.timer.clock)
    if split:
        sequence_parallel.gloo_length_gather(job.device)
        claims.whole_rows = sequence_parallel.record_whole_rows()
    startup.mark("framework_setup")
    model, built = build_model(job, files["attn_implementation"])
    startup.mark("model_build")
    claims.remember_prepared()
    claims.record_losses(SFTTrainer, split_rows=split)
    trainer = SFTTrainer(model=model, args=config, train_dataset=train_rows, processing_class=tokenizer,
                         peft_config=peft_config(job),
                         callbacks=[step_metrics_callback(recorder, startup), claims.callback])
    runtime = float(trainer.train().metrics["train_runtime"])
    if split:
        claims.settings.update(sequence_parallel.settings(trainer))
    write_run_report(job, recorder, claims, startup, version("trl"), runtime, NATIVE_LORA, rows_converted=rows,
                     built=built)


if __name__ == "__main__":
    main(sys.argv[1])
    exit_now()  # the report is written: no second of interpreter teardown in every run
