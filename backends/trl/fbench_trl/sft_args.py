"""TRL's `SFTConfig` arguments and DeepSpeed JSON, generated from a job (host side).

No torch or trl import: the plugin runs in the host process. The worker hands the JSON written
here to `SFTConfig(**...)` unchanged, so a run's configuration can be read in its folder.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins.contract import Job
from framework_bench.worker.hparams import ADAM_BETAS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY

from fbench_trl.run_files import DEEPSPEED, OUTPUT_DIR, RUN_FILE

SEED = 42  # the HF Trainer's default: native mode


def deepspeed_config(job: Job) -> dict:
    """The ZeRO stage with DeepSpeed's defaults for every bucket (XTuner's deepspeed_zero{1,2,3}.json
    and LLaMA-Factory's matched config: stage and overlap_comm), batch figures written out."""
    s = job.scenario
    return {"train_micro_batch_size_per_gpu": s.micro_batch, "gradient_accumulation_steps": s.grad_accum,
            "train_batch_size": s.micro_batch * s.grad_accum * s.cluster.gpus, "gradient_clipping": MAX_GRAD_NORM,
            "zero_allow_untested_optimizer": True, "bf16": {"enabled": job.device == "cuda" and s.precision == "bf16"},
            "fp16": {"enabled": False}, "zero_optimization": {"stage": s.zero_stage, "overlap_comm": True}}


def mode_args(job: Job) -> dict:
    """What differs between the settings modes. matched, as the other backends: fused torch AdamW on
    GPU, torch's own choice on CPU (`adamw_torch`), DDP without the unused-parameter search, 4 loader
    workers on GPU without pinning, the compare's seed. native: SFTConfig's defaults (fused AdamW on
    either device, its DDP and loader settings, seed 42)."""
    if job.settings_mode == "native":
        return {"seed": SEED}
    return {"optim": "adamw_torch_fused" if job.device == "cuda" else "adamw_torch", "ddp_find_unused_parameters": False,
            "dataloader_num_workers": 4 if job.device == "cuda" else 0, "dataloader_pin_memory": False,
            "seed": job.seed}


def sft_config(job: Job, deepspeed_file: Path | None) -> dict:
    """`SFTConfig` keyword arguments: the scenario's batch, steps, precision and checkpointing, the
    shared optimizer hyper-parameters and a constant rate, on rows the host packed (TRL's own
    dataset preparation and packing skipped; labels used as given), read in order."""
    s = job.scenario
    args = {
        "output_dir": str(Path(job.run_dir) / OUTPUT_DIR),
        "per_device_train_batch_size": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        "max_steps": s.steps.total,
        "learning_rate": LEARNING_RATE,
        "adam_beta1": ADAM_BETAS[0],
        "adam_beta2": ADAM_BETAS[1],
        "weight_decay": WEIGHT_DECAY,
        "max_grad_norm": MAX_GRAD_NORM,
        "lr_scheduler_type": "constant",
        "warmup_steps": 0,
        # SFTConfig defaults both on: bf16 on GPU only (bf16 on this CPU is ~15x slower), as the others
        "bf16": job.device == "cuda" and s.precision == "bf16",
        "fp16": False,
        "gradient_checkpointing": s.activation_checkpointing,
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        # the host's packed rows: no re-packing, no tokenizing, no truncation
        "dataset_kwargs": {"skip_prepare_dataset": True},
        "packing": False,
        "padding_free": False,
        "max_length": s.context_length,
        "train_sampling_strategy": "sequential",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        **mode_args(job),
    }
    if deepspeed_file is not None:
        args["deepspeed"] = str(deepspeed_file)
    return args


def attention(job: Job, flash_attn_installed: bool) -> str:
    """The model's attention: flash-attn 2 where it is installed on a GPU (as LLaMA-Factory's
    backend asks), else SDPA; the worker records what the model really got."""
    return "flash_attention_2" if job.device == "cuda" and flash_attn_installed else "sdpa"


def write_run_files(job: Job, flash_attn_installed: bool) -> dict[str, Path]:
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    ds_file = None
    if job.scenario.zero_stage > 0:
        ds_file = files["deepspeed"] = run_dir / DEEPSPEED
        ds_file.write_text(json.dumps(deepspeed_config(job), indent=2))
    files["run"] = run_dir / RUN_FILE
    files["run"].write_text(json.dumps({"sft_config": sft_config(job, ds_file),
                                        "attn_implementation": attention(job, flash_attn_installed)}, indent=2))
    return files
