"""Writes the files one XTuner run needs into its run folder (host side: no torch import).

The mmengine config mirrors XTuner's published speed-benchmark configs
(xtuner/configs/llama_speed_benchmark/*/*_full_alpaca_enzh_*_sp*.py in xtuner 0.2.0):
AdamW lr 2e-5, betas (0.9, 0.999), weight decay 0, grad clip 1, batch 1 per device,
rows packed to max_length, SupervisedFinetune, SequenceParallelSampler, ThroughputHook,
no checkpoints. What differs, and why:
  - data: the host's packed rows, read with `load_from_disk` (the worker converts them),
    instead of tokenising Alpaca inside the config, so every backend trains the same tokens;
  - model: random weights from the scenario's HF config (`build_random_llm`), no hub;
  - loop: `max_iters` = the scenario's steps x grad_accum instead of 3 epochs, and no LR
    schedule (the LR value does not change a step's cost);
  - precision: bf16 autocast (`AmpOptimWrapper`) on GPU as the published table's bf16
    DeepSpeed runs; fp32 `OptimWrapper` on CPU (AmpOptimWrapper refuses CPU);
  - DeepSpeed: the strategy `xtuner train --deepspeed deepspeed_zeroN` would build,
    written out, since the worker uses the Runner directly (`xtuner train` drops exit codes).
Settings modes (`fbench ... --settings`, in `job.settings_mode`):
  - native: as the published configs run: AmpOptimWrapper with its dynamic GradScaler, and
    bf16 weights (Adam states too) wherever XTuner picks flash-attn (xtuner/model/sft.py);
  - matched (default), aligned with the LLaMA-Factory backend's HF Trainer: fused AdamW on GPU,
    bf16 autocast with no loss scaler (`loss_scale=dict(enabled=False)`: a disabled
    GradScaler, as accelerate runs bf16) over fp32 weights (the builder keeps fp32 whatever
    XTuner asks).
  Rows stay in the host's order in both modes (the host checks what each step consumed).
LoRA/QLoRA (the scenario's `finetune`): XTuner's own `SupervisedFinetune(lora=dict(type=LoraConfig,
...))`, built through `build_adapted` (model_builder.py) so the adapters get the shared initial
weights; a QLoRA `llm` dict holds XTuner's `quantization_config=dict(type=BitsAndBytesConfig, ...)`
as its qlora configs do (xtuner/configs/llama/llama2_7b/llama2_7b_qlora_alpaca_e3.py), with the
scenario's quant type, double quantization and compute dtype in both modes. matched: the
scenario's rank, alpha, dropout and explicit targets (`adapters.lora_config`), the frozen weights
in its dtype; native: XTuner's configs' LoRA (`XTUNER_LORA`, targets from its
`find_all_linear_names`), and the fp32 upcast of its LoRA path kept.

mmengine parses a config with imports in lazy-import mode, where nothing may be called
at parse time: the file holds imports and literals only (values written with repr()).
"""

from __future__ import annotations

from pathlib import Path

from fbench_xtuner.run_layout import CONFIG_NAME, DATA_DIR, WORK_DIR
from framework_bench.plugins import model_folder
from framework_bench.plugins.contract import Job
from framework_bench.worker import adapters
from framework_bench.worker.hparams import ADAM_BETAS, LEARNING_RATE, MAX_GRAD_NORM, WEIGHT_DECAY


# The LoRA of XTuner's configs (every llama2_7b_qlora_*.py: r=64, lora_alpha=16, lora_dropout=0.1,
# bias='none'); no target_modules, so `_prepare_for_lora` adapts what `find_all_linear_names` finds.
XTUNER_LORA = {"r": 64, "lora_alpha": 16, "lora_dropout": 0.1, "bias": "none", "task_type": "CAUSAL_LM"}


def uses_deepspeed(job: Job) -> bool:
    """ZeRO needs DeepSpeed, and so does XTuner's sequence parallel (its strategy sets up the SP
    groups). On CPU too: DeepSpeed's CPU accelerator runs ZeRO over gloo."""
    return job.scenario.zero_stage > 0 or job.scenario.sequence_parallel > 1


def max_iters(job: Job) -> int:
    """One mmengine iteration is one micro-batch; an optimizer step is grad_accum of them
    (a step of `steps.unit: micro` is one iteration)."""
    return job.scenario.steps.total * job.scenario.micro_per_step


def deepspeed_config(job: Job) -> dict:
    """XTuner's configs/deepspeed/deepspeed_zero{1,2,3}.json with the "auto" fields resolved
    as `xtuner train` resolves them (from the mmengine config, bf16 from the scenario)."""
    s = job.scenario
    zero = {"stage": s.zero_stage, "overlap_comm": True}
    if s.zero_stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = True
    return {
        "gradient_accumulation_steps": s.grad_accum,
        "train_micro_batch_size_per_gpu": s.micro_batch,
        "gradient_clipping": MAX_GRAD_NORM,
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero,
        "fp16": {"enabled": False, "initial_scale_power": 16},
        "bf16": {"enabled": s.precision == "bf16"},
    }


def kwargs_text(kwargs: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def adapted_dtype(job: Job) -> str | None:
    """The dtype an adapted model's weights are built and filled in, given to the builder as
    XTuner's LoRA configs give it (`torch_dtype` in the llm dict): a matched LoRA's base dtype
    (filled as the torch reference fills it; `build_adapted` undoes XTuner's upcast), QLoRA's
    compute dtype (its base is quantized from it); None for full runs and native LoRA (XTuner's
    upcast makes that fp32)."""
    finetune = job.scenario.finetune
    if finetune.method == "qlora":
        return adapters.TORCH_DTYPES[finetune.compute_dtype]
    if finetune.method == "lora" and job.settings_mode == "matched":
        return adapters.TORCH_DTYPES[finetune.base_dtype]
    return None


def model_lines(job: Job) -> list[str]:
    """The `model` dict: XTuner's SupervisedFinetune over the random-weights builder, with
    peft's LoRA (and a 4-bit base for QLoRA) when the scenario asks for adapters."""
    s = job.scenario
    finetune = s.finetune
    matched = job.settings_mode == "matched"
    qlora = finetune.method == "qlora"
    dtype = adapted_dtype(job)
    keep_fp32 = matched and dtype in (None, "float32")  # a full matched run's fp32, whatever XTuner asks
    llm = [
        "    llm=dict(type=build_random_llm, pretrained_model_name_or_path=pretrained_model_name_or_path,",
        f"             trust_remote_code=True, keep_fp32_weights={keep_fp32!r}, init_seed={job.seed!r}),",
    ]
    if finetune.method == "full":
        return ["model = dict(", "    type=SupervisedFinetune,", "    use_varlen_attn=use_varlen_attn,",
                f"    use_activation_checkpointing={s.activation_checkpointing!r},", *llm, ")"]
    if dtype is not None:
        llm[-1] = llm[-1].removesuffix("),") + f", torch_dtype=torch.{dtype}" + ("," if qlora else "),")
    if qlora:
        llm += [
            "             quantization_config=dict(type=BitsAndBytesConfig, load_in_4bit=True, load_in_8bit=False,",
            "                                      llm_int8_threshold=6.0, llm_int8_has_fp16_weight=False,",
            f"                                      bnb_4bit_compute_dtype=torch.{dtype},",
            f"                                      bnb_4bit_use_double_quant={finetune.double_quant!r},",
            f"                                      bnb_4bit_quant_type={finetune.quant_type!r})),",
        ]
    lora = adapters.lora_config(finetune) if matched else XTUNER_LORA
    return [
        "model = dict(",
        "    type=build_adapted,  # SupervisedFinetune(**the rest), then the adapters' initial weights",
        f"    init_seed={job.seed!r},",
        f"    frozen_dtype={dtype if matched else None!r},",
        "    use_varlen_attn=use_varlen_attn,",
        f"    use_activation_checkpointing={s.activation_checkpointing!r},",
        *llm,
        f"    lora=dict(type=LoraConfig, {kwargs_text(lora)}),",
        ")",
    ]


def render(job: Job) -> str:
    """The config file's text."""
    s = job.scenario
    gpu = job.device == "cuda"
    deepspeed = uses_deepspeed(job)
    varlen = s.attention == "varlen"
    amp = gpu and s.precision == "bf16" and not deepspeed
    matched = job.settings_mode == "matched"
    hooks = ["ThroughputHook", "VarlenAttnArgsToMessageHubHook"] if varlen else ["ThroughputHook"]
    imports = [
        "from datasets import load_from_disk",
        "from mmengine.hooks import CheckpointHook, DistSamplerSeedHook, IterTimerHook, LoggerHook, ParamSchedulerHook",
        "from mmengine.runner import IterBasedTrainLoop",
        "from torch.optim import AdamW",
        "from xtuner.dataset.collate_fns import default_collate_fn",
        f"from xtuner.engine.hooks import {', '.join(hooks)}",
        "from xtuner.model import SupervisedFinetune",
        "from xtuner.parallel.sequence import SequenceParallelSampler",
        "from fbench_xtuner.model_builder import build_random_llm",
    ]
    if s.finetune.method != "full":
        imports[-1] = "from fbench_xtuner.model_builder import build_adapted, build_random_llm"
        imports.append("from peft import LoraConfig")
    if adapted_dtype(job):
        imports.append("import torch")
    if s.finetune.method == "qlora":
        imports.append("from transformers import BitsAndBytesConfig")
    if deepspeed:
        imports.append("from xtuner.engine import DeepSpeedStrategy")
    else:
        imports.append(f"from mmengine.optim import {'AmpOptimWrapper' if amp else 'OptimWrapper'}")

    # matched: fused AdamW on GPU, as every backend there; native: XTuner's unflagged AdamW
    # (foreach on GPU). CPU: torch's own choice in both (the for-loop).
    fused = ", fused=True" if matched and gpu else ""
    optimizer = f"dict(type=AdamW, lr={LEARNING_RATE!r}, betas={ADAM_BETAS!r}, weight_decay={WEIGHT_DECAY!r}{fused})"
    if deepspeed:
        # What `xtuner train --deepspeed` substitutes for the config's optim_wrapper.
        optim_wrapper = f'dict(type="DeepSpeedOptimWrapper", optimizer={optimizer})'
    elif amp:
        optim_wrapper = (
            f"dict(type=AmpOptimWrapper, optimizer={optimizer}, "
            f"clip_grad=dict(max_norm={MAX_GRAD_NORM!r}, error_if_nonfinite=False), "
            f"accumulative_counts={s.grad_accum!r}, dtype='bfloat16'"
            + (", loss_scale=dict(enabled=False))" if matched else ")")
        )
    else:
        optim_wrapper = (
            f"dict(type=OptimWrapper, optimizer={optimizer}, "
            f"clip_grad=dict(max_norm={MAX_GRAD_NORM!r}, error_if_nonfinite=False), "
            f"accumulative_counts={s.grad_accum!r})"
        )

    custom_hooks = ", ".join(f"dict(type={h})" for h in hooks)

    # The published configs load with 4 workers; on CPU they would take cores from the
    # trainer, and the rows are already tokenised, so the main process reads them.
    num_workers = 4 if gpu else 0
    lines = [
        f"# Generated by fbench (fbench_xtuner/mmengine_config.py) for scenario {s.name!r}: do not edit.",
        "# Modelled on xtuner/configs/llama_speed_benchmark (xtuner 0.2.0); literals only (lazy-import mode).",
        *imports,
        "",
        f"pretrained_model_name_or_path = {str(job.run_dir / model_folder.MODEL_DIR)!r}",
        f"use_varlen_attn = {varlen!r}",
        f"sequence_parallel_size = {s.sequence_parallel!r}",
        f"max_length = {s.context_length!r}",
        f"batch_size = {s.micro_batch!r}  # per device",
        f"accumulative_counts = {s.grad_accum!r}",
        f"max_norm = {MAX_GRAD_NORM!r}",
        "",
        *model_lines(job),
        "",
        "train_dataloader = dict(",
        "    batch_size=batch_size,",
        f"    num_workers={num_workers!r},",
        f"    dataset=dict(type=load_from_disk, dataset_path={str(job.run_dir / DATA_DIR)!r}),",
        "    # Rows in the host's packed order: the run trains exactly the stream that was hashed.",
        f"    sampler=dict(type=SequenceParallelSampler, shuffle=False, seed={job.seed!r}),",
        "    collate_fn=dict(type=default_collate_fn, use_varlen_attn=use_varlen_attn),",
        ")",
        "",
        f"optim_wrapper = {optim_wrapper}",
    ]
    if deepspeed:
        lines += [
            "strategy = dict(",
            "    type=DeepSpeedStrategy,",
            f"    config={deepspeed_config(job)!r},",
            "    gradient_accumulation_steps=accumulative_counts,",
            "    train_micro_batch_size_per_gpu=batch_size,",
            "    gradient_clipping=max_norm,",
            "    exclude_frozen_parameters=True,",
            "    sequence_parallel_size=sequence_parallel_size,",
            ")",
            'runner_type = "FlexibleRunner"',
        ]
    lines += [
        "",
        f"train_cfg = dict(type=IterBasedTrainLoop, max_iters={max_iters(job)!r})",
        "",
        f"custom_hooks = [{custom_hooks}]",
        "default_hooks = dict(",
        "    timer=dict(type=IterTimerHook),",
        "    logger=dict(type=LoggerHook, log_metric_by_epoch=False, interval=1),",
        "    param_scheduler=dict(type=ParamSchedulerHook),",
        "    # Speed only: never save weights.",
        "    checkpoint=dict(type=CheckpointHook, by_epoch=False, interval=-1, save_last=False),",
        "    sampler_seed=dict(type=DistSamplerSeedHook),",
        ")",
        "env_cfg = dict(",
        "    cudnn_benchmark=False,",
        "    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),",
        f"    dist_cfg=dict(backend={'nccl' if gpu else 'gloo'!r}),",
        ")",
        "visualizer = None  # mmengine's default: LocalVisBackend, i.e. vis_data/scalars.json",
        "log_level = 'INFO'",
        "load_from = None",
        "resume = False",
        f"randomness = dict(seed={job.seed!r}, deterministic=False)",
        "log_processor = dict(by_epoch=False, window_size=1)",
        f"work_dir = {str(job.run_dir / WORK_DIR)!r}",
        "",
    ]
    return "\n".join(lines)


def write(job: Job) -> dict[str, Path]:
    """Write the model folder and the config into the run folder; returns them by role."""
    model_dir = model_folder.write_model_dir(job)
    config = job.run_dir / CONFIG_NAME
    config.write_text(render(job))
    return {"mmengine_config": config, "model_dir": model_dir}
