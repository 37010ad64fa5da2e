"""A Hugging Face model built from the job's config, with the compare's initial weights, and what
a rank holds once it is built.

For workers that build the model themselves (a plain loop); a framework that builds its own
calls `initial_weights_worker.fill` on what it built instead. torch and transformers are imported
when called, in the backend's env.
"""

from __future__ import annotations

from framework_bench.worker import adapters, initial_weights_worker
from framework_bench.worker.job import Job


def from_config(job: Job, device, **kwargs):
    """The model of `job.hf_config` with random weights, made where it trains (initialising 7B
    fp32 weights on the CPU and copying them over takes minutes, which start-up would count),
    then, for a LoRA/QLoRA scenario, wrapped in peft's adapters (`adapters.attach`), filled with
    the seed's weights (every backend's; base and adapters), checkpointing its activations when
    the scenario asks. `kwargs` go to `from_config` (attention implementation, dtype; a LoRA
    base is built in the scenario's `base_dtype`)."""
    import torch
    import transformers

    cfg = dict(job.hf_config)
    config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(job.seed)
    finetune = job.scenario.finetune
    if finetune.adapters:  # the frozen base: lora's base dtype; qlora's unquantized rest in its compute dtype
        kwargs["dtype"] = getattr(torch, adapters.TORCH_DTYPES[
            finetune.base_dtype if finetune.method == "lora" else finetune.compute_dtype])
    with device:
        model = transformers.AutoModelForCausalLM.from_config(config, **kwargs)
    if finetune.adapters:
        model = adapters.attach(model, job)
    initial_weights_worker.fill(model, job.seed, job.hf_config)
    if finetune.method == "qlora":
        adapters.quantize_base(model, finetune, device)
    if job.scenario.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.to(device).train()


def held_at_build(model, device: str) -> dict:
    """What this rank holds once the model is built (under ZeRO-3 its shard, each parameter's
    `ds_tensor`), against the whole model, and its peak memory by then (`PeakMemory`: resident on
    CPU, allocated on CUDA): a worker report's `built`, which shows a partitioned build."""
    from framework_bench.worker.settings import param_count
    from framework_bench.worker.steps import PeakMemory

    held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in model.parameters())
    return {"elements_held": held, "elements_whole": param_count(model), "peak_bytes": PeakMemory(device).read()[0]}
