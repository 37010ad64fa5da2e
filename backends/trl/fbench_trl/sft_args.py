"""TRL's `SFTConfig` arguments and DeepSpeed JSON, generated from a job (host side).

No torch or trl import: the plugin runs in the host process. The worker hands the JSON written
here to `SFTConfig(**...)` unchanged, so a run's configuration can be read in its folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins import hf_trainer_args
from framework_bench.plugins.contract import Job

from fbench_trl.run_files import DEEPSPEED, OUTPUT_DIR, RUN_FILE

SEED = 42  # the HF Trainer's default: native mode


def mode_args(job: Job) -> dict:
    """matched: as every backend (`hf_trainer_args.matched_args`); native: SFTConfig's defaults
    (fused AdamW on either device, its DDP and loader settings) and seed 42."""
    return hf_trainer_args.matched_args(job) if job.settings_mode == "matched" else {"seed": SEED}


def sft_config(job: Job, deepspeed_file: Path | None) -> dict:
    """`SFTConfig` keyword arguments: the scenario's batch, steps, precision and checkpointing, the
    shared optimizer hyper-parameters and a constant rate, on rows the host packed (TRL's own
    dataset preparation and packing skipped; labels used as given), read in order."""
    s = job.scenario
    args = {
        "output_dir": str(Path(job.run_dir) / OUTPUT_DIR),
        **hf_trainer_args.training_args(job),
        # SFTConfig turns both on by default: bf16 follows the scenario (`training_args`), and so does this
        "fp16": False,
        "gradient_checkpointing": s.activation_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        # the host's packed rows: no re-packing, no tokenizing, no truncation
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "packing": False,
        "padding_free": False,
        "max_length": s.context_length,
        "train_sampling_strategy": "sequential",
        **mode_args(job),
    }
    if s.arch.family.moe and job.settings_mode == "matched":
        # SFTConfig turns the router's aux loss on whenever the config's coefficient is non-zero, over the
        # config's output_router_logits: the scenario's loss, with it only where the model's config adds it
        args["router_aux_loss_coef"] = s.arch.router_aux_loss_coef if s.arch.output_router_logits else 0.0
    if deepspeed_file is not None:
        args["deepspeed"] = str(deepspeed_file)
    return args


def sequence_parallel(job: Job, attn: str) -> dict | None:
    """accelerate's `ParallelismConfig` and its `DeepSpeedSequenceParallelConfig` (ALST's Ulysses,
    around the attention the model is built with) as keyword arguments, or None without SP. Rows
    are all the context long: no variable-length handling. SP spans every process (the plugin
    refuses it beside data parallel), so accelerate's other sizes stay 1."""
    s = job.scenario
    if s.sequence_parallel == 1:
        return None
    return {"sp_backend": "deepspeed", "sp_size": s.sequence_parallel,
            "sp_handler": {"sp_seq_length": s.context_length, "sp_seq_length_is_variable": False,
                           "sp_attn_implementation": attn}}


def write_run_files(job: Job, flash_attn_installed: bool) -> dict[str, Path]:
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    if (ds_file := hf_trainer_args.write_deepspeed_config(job, run_dir / DEEPSPEED)) is not None:
        files["deepspeed"] = ds_file
    attn = hf_trainer_args.attn_implementation(job, flash_attn_installed)
    files["run"] = run_dir / RUN_FILE
    run = {"sft_config": sft_config(job, ds_file), "attn_implementation": attn,
           "parallelism_config": sequence_parallel(job, attn)}
    files["run"].write_text(json.dumps(run, indent=2))
    return files
