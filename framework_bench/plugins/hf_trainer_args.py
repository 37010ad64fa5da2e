"""What every backend whose framework trains with the HF Trainer (its `TrainingArguments` or a
subclass: LLaMA-Factory's arguments, ms-swift's `SftArguments`, TRL's `SFTConfig`) is given alike,
from a job (host side):
the scenario's batch, steps and precision with the shared optimizer hyper-parameters at a
constant rate, a loss line per step and nothing saved (`training_args`); matched mode's
alignments (`matched_args`); the DeepSpeed JSON with its batch figures written out
(`deepspeed_config`, written by `write_deepspeed_config`); the attention the model asks for
(`attn_implementation`); what such a backend refuses whatever its framework (`refusal`)."""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins.contract import BackendEnv, Job
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.hparams import ADAM_BETAS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY


def training_args(job: Job) -> dict:
    s = job.scenario
    return {
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
        # bf16 mixed precision on GPU; fp32 on CPU (bf16 there is ~15x slower without AMX).
        "bf16": job.device == "cuda" and s.precision == "bf16",
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
    }


def matched_args(job: Job) -> dict:
    """Matched mode, as every backend: fused torch AdamW on GPU (less time and memory than
    foreach), torch's own choice on CPU (`adamw_torch`: the for-loop), DDP without the
    unused-parameter search (XTuner's mmengine DDP), the data loader's worker count and pinning
    as XTuner's published configs (4 workers on GPU, none on CPU where they would take the
    trainer's cores; no pinning), the compare's seed."""
    cuda = job.device == "cuda"
    return {"optim": "adamw_torch_fused" if cuda else "adamw_torch", "ddp_find_unused_parameters": False,
            "dataloader_num_workers": 4 if cuda else 0, "dataloader_pin_memory": False, "seed": job.seed}


def deepspeed_config(job: Job, zero: dict | None = None) -> dict:
    """The ZeRO config (`zero`; matched mode's by default: XTuner's own deepspeed_zero{1,2,3}.json,
    stage and overlap_comm, DeepSpeed's defaults for every bucket and prefetch size), with the
    batch figures written out (not "auto") so transformers checks them against the arguments."""
    s = job.scenario
    return {
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_accumulation_steps": s.grad_accum,
        # HF Trainer has no sequence parallelism: every process is a data-parallel rank.
        "train_batch_size": s.micro_batch * s.grad_accum * s.cluster.gpus,
        "gradient_clipping": MAX_GRAD_NORM,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": job.device == "cuda" and s.precision == "bf16"},
        "fp16": {"enabled": False},
        "zero_optimization": zero or {"stage": s.zero_stage, "overlap_comm": True},
    }


def write_deepspeed_config(job: Job, path: Path, config: dict | None = None) -> Path | None:
    """`config` (matched mode's `deepspeed_config` by default) at `path` for a ZeRO scenario: the
    file the arguments name; None and nothing written without ZeRO."""
    if job.scenario.zero_stage == 0:
        return None
    path.write_text(json.dumps(config or deepspeed_config(job), indent=2))
    return path


def attn_implementation(job: Job, flash_attn_installed: bool) -> str:
    """flash-attn 2 where it is installed on a GPU, else SDPA: asked for by name, so the worker's
    record of what the model really got shows a silent fallback."""
    return "flash_attention_2" if job.device == "cuda" and flash_attn_installed else "sdpa"


def refusal(scenario: Scenario, env: BackendEnv, deepspeed_layer: str | None = None) -> str | None:
    """Micro-batch steps (the HF Trainer counts and reports optimizer steps only), and ZeRO in an
    env without deepspeed (a CPU flavour may leave it out; `deepspeed_layer`, a pin such as
    "deepspeed==0.18.6", names the layer over the env that runs it); None otherwise."""
    if scenario.steps.unit == "micro":
        return (f"steps.unit micro is not planned for {env.name}: the HF Trainer counts optimizer steps (max_steps) "
                "and reports per optimizer step only")
    if scenario.zero_stage > 0 and not env.has("deepspeed"):
        layer = f"; `--backends {env.name}@{deepspeed_layer}` runs it in a layer over that env with DeepSpeed" if deepspeed_layer else ""
        return (f"ZeRO stage {scenario.zero_stage} runs through the HF Trainer's DeepSpeed integration, and the "
                f"{env.name} env has no deepspeed (its requirements leave it out: see them){layer}")
    return None
