"""ms-swift's `SftArguments`, the model folder and DeepSpeed JSON, generated from a job (host side).

No torch or swift import: the plugin runs in the host process. The worker hands the JSON written
here to `SftArguments(**...)` unchanged (adding only the cached-dataset folder it writes), so a
run's configuration can be read in its folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins import hf_trainer_args, model_folder
from framework_bench.plugins.contract import Job
from framework_bench.scenario.scenario import Scenario

from fbench_swift.run_files import DEEPSPEED, OUTPUT_DIR, ROWS_DIR, RUN_FILE

SEED = 42  # SftArguments' default: native mode
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def refusal(scenario: Scenario) -> str | None:
    """Sequence parallel over more ranks than the K/V heads split into: ms-swift 4.6 gives Ulysses
    gcd(heads, group) ranks and the rest to ring attention, which it runs on padding-free batches
    only (swift/sequence_parallel/sequence_parallel.py:378), not on the packed rows fed here."""
    sp, kv = scenario.sequence_parallel, scenario.arch.num_key_value_heads
    if sp > 1 and kv % sp:
        return (f"sequence_parallel {sp} with {kv} K/V heads: ms-swift 4.6 runs what Ulysses cannot split as ring "
                "attention, on padding-free batches only (padding_free), not on fbench's packed rows")
    return None


def tuner_args(job: Job) -> dict:
    """Full fine-tuning, or LoRA: the scenario's adapters (matched) or ms-swift's own LoRA
    defaults (native: lora_rank 8, lora_alpha 32, lora_dropout 0.05, target_modules all-linear)."""
    f = job.scenario.finetune
    if not f.adapters:
        return {"tuner_type": "full"}
    if job.settings_mode == "native":
        return {"tuner_type": "lora"}
    return {"tuner_type": "lora", "lora_rank": f.rank, "lora_alpha": f.alpha, "lora_dropout": f.dropout,
            "target_modules": list(f.targets), "lora_bias": "none", "use_rslora": False, "use_dora": False}


def mode_args(job: Job) -> dict:
    """matched: as every backend (`hf_trainer_args.matched_args`); native: SftArguments' defaults
    (fused AdamW, 1 loader worker) and seed 42."""
    return hf_trainer_args.matched_args(job) if job.settings_mode == "matched" else {"seed": SEED}


def torch_dtype(job: Job) -> str:
    """The dtype ms-swift builds the model in: fp32 for full fine-tuning (every weight trains, as
    the other backends), an adapter run's frozen base in the scenario's base dtype."""
    f = job.scenario.finetune
    return DTYPES[f.base_dtype] if f.adapters else "float32"


def sft_args(job: Job, deepspeed_file: Path | None, attn_impl: str) -> dict:
    """`SftArguments` keyword arguments. Every default of ms-swift's that differs from the
    scenario is set in both modes: learning rate (1e-5 / 1e-4), weight decay 0.1, Adam beta2 0.95,
    cosine schedule, gradient checkpointing on, accumulation ceil(16 / batch / world), 3 epochs,
    fp16 switched on by an fp32 torch_dtype, tensorboard reports, versioned output folders."""
    s = job.scenario
    run_dir = Path(job.run_dir)
    args = {
        # the model: config.json and tokenizer, built with random weights (SwiftSft's dummy model path)
        "model": str(run_dir / model_folder.MODEL_DIR),
        "model_type": s.arch.architecture,  # ms-swift's LLMModelType: HF's model_type for fbench's families
        "template": "dummy",  # rows arrive encoded: the template only collates them
        "torch_dtype": torch_dtype(job),
        "attn_impl": attn_impl,
        "use_hf": True,
        "check_model": False,
        # data: the host's packed rows as an ms-swift cached dataset, read in order, unfiltered
        "cached_dataset": [str(run_dir / ROWS_DIR)],
        "max_length": s.context_length,
        "truncation_strategy": "delete",  # drops rows over max_length: none is
        "train_dataloader_shuffle": False,
        "packing": False,
        "padding_free": False,
        "sequence_parallel_size": s.sequence_parallel,
        # the LM head over every position: logits_to_keep rewrites the labels the model is fed
        "use_logits_to_keep": False,
        "output_dir": str(run_dir / OUTPUT_DIR),
        "add_version": False,
        **hf_trainer_args.training_args(job),
        "fp16": False,  # an fp32 torch_dtype switches it on
        "gradient_checkpointing": s.activation_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        **tuner_args(job),
        **mode_args(job),
    }
    if deepspeed_file is not None:
        args["deepspeed"] = str(deepspeed_file)
    return args


def write_run_files(job: Job, flash_attn_installed: bool) -> dict[str, Path]:
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {"model_dir": model_folder.write_model_dir(job, torch_dtype(job))}
    if (ds_file := hf_trainer_args.write_deepspeed_config(job, run_dir / DEEPSPEED)) is not None:
        files["deepspeed"] = ds_file
    attn = hf_trainer_args.attn_implementation(job, flash_attn_installed)
    files["run"] = run_dir / RUN_FILE
    files["run"].write_text(json.dumps({"sft_args": sft_args(job, ds_file, attn)}, indent=2))
    return files
