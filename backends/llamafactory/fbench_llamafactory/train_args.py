"""LLaMA-Factory's training arguments and DeepSpeed JSON, generated from a job (host side).

No torch or llamafactory import here: the plugin runs in the host process. The worker
reads the files written by `write_run_files` and hands them to LLaMA-Factory unchanged,
so a run can be repeated by hand with `llamafactory-cli train <run_dir>/llamafactory_train.json`
(once the worker has built the tokenized data; not a QLoRA run, whose base the worker hands
over in memory: `finetune_args`).
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins import hf_trainer_args, model_folder
from framework_bench.plugins.contract import Job
from framework_bench.worker.hparams import LEARNING_RATE, MAX_GRAD_NORM

from fbench_llamafactory import run_files

SEED = 42  # LLaMA-Factory's (the HF Trainer's) default: native mode

# LLaMA-Factory requires a dataset name even when `tokenized_path` already holds the data;
# it is never looked up because the tokenized data exists when training starts.
DUMMY_DATASET = "fbench_packed"


def attention_request(job: Job, flash_attn_installed: bool) -> str:
    """LLaMA-Factory's `flash_attn` value: fa2 where flash-attn is installed on a GPU, else sdpa.

    Asking for fa2 explicitly (not `auto`) lets the worker detect LLaMA-Factory's silent
    fallback to SDPA by comparing with the implementation the model really got.
    """
    return "fa2" if job.device == "cuda" and flash_attn_installed else "sdpa"


def deepspeed_config(job: Job) -> dict:
    """ZeRO stage from the scenario, with the batch figures written out (`hf_trainer_args`).

    matched: XTuner's own deepspeed_zero{1,2,3}.json (stage, overlap_comm) with DeepSpeed's
    defaults for every bucket and prefetch size, so both frameworks run the same ZeRO config.
    native: LLaMA-Factory's examples/deepspeed/ds_z{2,3}_config.json (stage 1 from the stage-2
    file), whose "auto" sizes transformers fills from the model's hidden size.
    """
    s = job.scenario
    if job.settings_mode == "matched":
        return hf_trainer_args.deepspeed_config(job)
    if s.zero_stage == 3:
        zero = {"stage": 3, "overlap_comm": False, "contiguous_gradients": True, "sub_group_size": 1e9,
                "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto", "stage3_max_live_parameters": 1e9,
                "stage3_max_reuse_distance": 1e9,
                "stage3_gather_16bit_weights_on_model_save": False}  # nothing is saved
    else:
        zero = {"stage": s.zero_stage, "allgather_partitions": True, "allgather_bucket_size": 5e8,
                "overlap_comm": False, "reduce_scatter": True, "reduce_bucket_size": 5e8,
                "contiguous_gradients": True, "round_robin_gradients": True}
    return hf_trainer_args.deepspeed_config(job, zero)


def mode_args(job: Job) -> dict:
    """What differs between the settings modes (framework_bench: --settings).

    matched: `hf_trainer_args.matched_args`, as every backend. native, as LLaMA-Factory's
    examples run: transformers' default optimizer (fused AdamW), its default DDP and data-loader
    settings and seed; 4 loader workers on GPU (the examples' value). Both: no token counting
    (`include_num_input_tokens_seen`, an all-gather and a host sync per micro-batch that fbench
    once added to this side only; the host counts tokens itself).
    """
    if job.settings_mode == "native":
        return {"dataloader_num_workers": 4 if job.device == "cuda" else 0, "seed": SEED}
    return hf_trainer_args.matched_args(job)


def finetune_args(job: Job) -> dict:
    """LLaMA-Factory's own fine-tuning arguments for the scenario's `finetune`.

    full: every weight, the model built from its config (`train_from_scratch`). lora/qlora:
    `finetuning_type: lora`, whose `init_adapter` wraps the model with peft and upcasts the
    adapters (the trainable parameters) to fp32 while the frozen base keeps the dtype it was
    built in (the model folder's config.json: `model_folder.write_model_dir`). matched: the scenario's
    rank, alpha, dropout and explicit targets, rsLoRA and DoRA off; native: LLaMA-Factory's
    defaults (named in the run's notes: worker.NATIVE_LORA). qlora: its on-the-fly
    bitsandbytes 4-bit quantization with the scenario's quant type and double quantization
    in both modes (they describe the base, not the adapters); compute and storage dtype
    follow its bf16 switch (`plugin.adapter_refusal` refuses anything else). It quantizes
    only in `from_pretrained`, so a qlora run loads rather than builds its base: the worker
    hands the random base over as a state dict.
    """
    f = job.scenario.finetune
    if f.method == "full":
        return {"finetuning_type": "full", "train_from_scratch": True}
    args: dict = {"finetuning_type": "lora", "train_from_scratch": f.method != "qlora"}
    if job.settings_mode == "matched":
        args.update({"lora_rank": f.rank, "lora_alpha": f.alpha, "lora_dropout": f.dropout,
                     "lora_target": ",".join(f.targets), "use_rslora": False, "use_dora": False})
    if f.method == "qlora":
        args.update({"quantization_bit": 4, "quantization_method": "bnb", "quantization_type": f.quant_type,
                     "double_quantization": f.double_quant})
    return args


def train_args(job: Job, flash_attn: str, deepspeed_file: Path | None) -> dict:
    """`run_exp` arguments for LLaMA-Factory's (v0) SFT trainer on the pre-tokenized rows."""
    s = job.scenario
    run_dir = Path(job.run_dir)
    args = {
        "stage": "sft",
        "do_train": True,
        **finetune_args(job),
        "model_name_or_path": str(run_dir / model_folder.MODEL_DIR),
        "flash_attn": flash_attn,
        "disable_gradient_checkpointing": not s.activation_checkpointing,
        "dataset": DUMMY_DATASET,
        "template": "default",
        "tokenized_path": str(run_dir / run_files.TOKENIZED_DIR),
        "cutoff_len": s.context_length,
        # packed: an all-ones mask, attention crosses example boundaries (XTuner use_varlen_attn=False);
        # varlen: segment ids in attention_mask, one attention block per example.
        "packing": True,
        "neat_packing": s.attention == "varlen",
        # Keep the host's row order, as the other backends do.
        "disable_shuffling": True,
        "output_dir": str(run_dir / run_files.OUTPUT_DIR),
        "overwrite_output_dir": True,
        **hf_trainer_args.training_args(job),
        **mode_args(job),
    }
    if deepspeed_file is not None:
        args["deepspeed"] = str(deepspeed_file)
    return args


def v1_kv_head_refusal(scenario) -> str | None:
    """Why LLaMA-Factory 0.9.5's Ulysses cannot split this model's K/V heads, or None.

    Its all-to-all splits the K/V heads over the cp group without repeating them
    (`torch.tensor_split` over the heads: with fewer heads than ranks, some ranks get none),
    and its own guard compares the attention heads with themselves, so it never fires. No
    KV-head replication exists in 0.9.5, hence a refusal rather than a wrong attention."""
    sp, kv = scenario.sequence_parallel, scenario.arch.num_key_value_heads
    if sp > 1 and kv % sp:
        return (f"sequence_parallel {sp} with {kv} KV heads: LLaMA-Factory 0.9.5's Ulysses (v1 trainer) splits "
                f"the K/V heads over the {sp} ranks without replicating them, so cp_size must divide "
                f"num_key_value_heads ({kv}); it has no KV-head replication")
    return None


def v1_train_args(job: Job) -> dict:
    """Arguments for LLaMA-Factory's v1 trainer (FSDP2 + Ulysses sequence parallel).

    The model is built from its config, with no weight files: `init_config` asks for
    LLaMA-Factory's rank-0 initialisation, and the worker's model engine builds rank 0's copy
    from the config (random weights) instead of `from_pretrained`. `reshard_after_forward` follows the
    ZeRO stage: 3 shards parameters like ZeRO-3, below it FSDP2 keeps them gathered (ZeRO-2-like).
    0.9.5 registers no optimizer plugin, so v1 trains with `torch.optim.AdamW(lr=...)`: the
    same betas, but torch's default weight decay 0.01 instead of 0 (no effect on speed).
    """
    s = job.scenario
    run_dir = Path(job.run_dir)
    dp = s.data_parallel
    return {
        "model": str(run_dir / model_folder.MODEL_DIR),
        "template": "default",
        "flash_attn": "flash_attention_2",  # Ulysses in 0.9.5 refuses anything else
        "init_config": {"name": run_files.V1_INIT},
        "train_dataset": str(run_dir / run_files.V1_DATA),
        "output_dir": str(run_dir / run_files.OUTPUT_DIR),
        "micro_batch_size": s.micro_batch,
        "global_batch_size": s.micro_batch * s.grad_accum * dp,
        "cutoff_len": s.context_length,
        "learning_rate": LEARNING_RATE,
        "max_steps": s.steps.total,
        "max_grad_norm": MAX_GRAD_NORM,
        "bf16": s.precision == "bf16",
        "batching_workers": 0,
        "enable_activation_checkpointing": s.activation_checkpointing,
        "dist_config": {
            "name": "fsdp2",
            "cp_size": s.sequence_parallel,
            "cp_mode": "ulysses",
            "reshard_after_forward": s.zero_stage == 3,
        },
        "logging_steps": 1,
        "seed": SEED,
    }


# The scenario's dtype names as config.json's `dtype`, which `from_config` builds in (and
# `from_pretrained`'s `torch_dtype="auto"`, LLaMA-Factory's, loads in).
CONFIG_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def base_dtype(job: Job) -> str | None:
    """config.json's dtype: an adapter run's frozen base is stored as a checkpoint of the
    scenario's base dtype would be (qlora: its compute dtype, which the unquantized modules
    keep and the 4-bit ones are quantized from); full fine-tuning leaves it out (fp32: every
    weight trains and LLaMA-Factory upcasts trainable weights to fp32 anyway)."""
    f = job.scenario.finetune
    if f.method == "full":
        return None
    return CONFIG_DTYPES[f.compute_dtype if f.method == "qlora" else f.base_dtype]


def write_run_files(job: Job, flash_attn_installed: bool) -> dict[str, Path]:
    """Write every generated file into the run folder; returns them by role."""
    run_dir = Path(job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    files = {"model_dir": model_folder.write_model_dir(job, base_dtype(job))}
    s = job.scenario
    target = run_files.args_file(run_dir, s.sequence_parallel)
    if run_files.uses_v1_trainer(s.sequence_parallel):
        args = v1_train_args(job)
    else:
        ds_file = hf_trainer_args.write_deepspeed_config(job, run_dir / run_files.DEEPSPEED, deepspeed_config(job))
        if ds_file is not None:
            files["deepspeed"] = ds_file
        args = train_args(job, attention_request(job, flash_attn_installed), ds_file)
    target.write_text(json.dumps(args, indent=2))
    files["train_args"] = target
    return files
