"""The LLaMA-Factory backend plugin (host side): what it supports, the files it generates,
and how it reads a finished run back.

Registered through the `fbench.backends` entry point (pyproject.toml). No torch or
llamafactory import: the worker (`fbench_llamafactory.worker`) runs in the backend's env.
"""

from __future__ import annotations

import json
from pathlib import Path

from framework_bench.plugins.contract import (AdamWImpl, BackendEnv, BackendInfo, Capabilities, EnvSpec, Job,
                                             Machine, MemoryScheme)
from framework_bench.plugins.base import Backend
from framework_bench.plugins.deepspeed_settings import DEEPSPEED_SPEED_SETTINGS, DEEPSPEED_VERSION_NOTE
from framework_bench.scenario.scenario import Scenario

from fbench_llamafactory import run_files, train_args

NAME = "llamafactory"
HERE = Path(__file__).parent
FLASH_ATTN = "flash-attn"


def backend_info() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        framework="LLaMA-Factory",
        description="LLaMA-Factory's SFT trainer (run_exp) on pre-tokenized packed rows; "
        "sequence parallel through its v1 trainer (FSDP2 + Ulysses)",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=True, varlen=True, zero_stages=[0, 1, 2, 3],
                                  lora=True, qlora=True),
        env=EnvSpec(
            requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
            framework_package="llamafactory",
            post_install=["fbench_llamafactory.env_fixups", "framework_bench.plugins.deepspeed_jit"],
            # its YAML keys and trainer entry as 0.9.5 has them; llamafactory caps transformers itself
            supports={"llamafactory": ">=0.9.5,<0.10"},
        ),
        # matched: `optim: adamw_torch_fused` on CUDA, `adamw_torch` (torch's choice) on CPU;
        # native: transformers' default with torch >= 2.8, `adamw_torch_fused`, on either device.
        # Sequence parallel runs on the v1 trainer (FSDP2), which builds torch AdamW with no flag.
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused", cpu="fused")},
                            sequence_parallel="fsdp2", sequence_parallel_adamw="foreach"),
        contract=5,  # the plugin contract it is written against: every claim made, the warm-up's projection included
        speed_settings=DEEPSPEED_SPEED_SETTINGS,
        report_notes=[
            DEEPSPEED_VERSION_NOTE,
            "LLaMA-Factory 0.9.5 runs on transformers 5.6 (it needs >= 4.55).",
            "Sequence-parallel rows: LLaMA-Factory has sequence parallelism only in its v1 trainer (FSDP2 + Ulysses).",
        ],
    )


def framework_throughput(job: Job, fbench_seconds: float = 0.0) -> dict[str, float]:
    """The HF Trainer's own figure under LLaMA-Factory: `train_results.json` in output_dir
    (written by LLaMA-Factory's SFT workflow) holds `train_runtime`, the seconds of the whole
    training loop, warm-up included. Tokens per GPU over that run / that runtime, less
    `fbench_seconds` (what the worker's own `on_train_begin` took inside it: the initial seed's
    reveal, fill and report, no work of the framework's), is its rate per GPU, which the host
    compares with its own whole-run figure (framework_bench/measure/verify.py).
    Its per-step log has no token rate unless `include_num_input_tokens_seen` adds a sync to
    every micro-batch, which fbench no longer asks for.
    """
    path = Path(job.run_dir) / run_files.OUTPUT_DIR / run_files.TRAIN_RESULTS
    if not path.exists():
        return {}
    runtime = float(json.loads(path.read_text()).get("train_runtime") or 0)
    if runtime <= 0:
        return {}
    tokens_per_gpu = job.steps * job.scenario.tokens_per_gpu_step
    return {"tokens_per_sec_whole_run": tokens_per_gpu / max(runtime - fbench_seconds, 1e-9), "train_runtime": runtime}


def adapter_refusal(scenario: Scenario) -> str | None:
    """Why LLaMA-Factory, as fbench drives it, cannot train this scenario's adapters, or None."""
    f = scenario.finetune
    if f.method == "full":
        return None
    if scenario.sequence_parallel > 1:
        return (f"{f.method} with sequence_parallel > 1 is not planned: LLaMA-Factory's v1 trainer (its only "
                "sequence parallel) is driven for full fine-tuning only")
    if f.method != "qlora":
        return None
    if scenario.zero_stage == 3:
        # the random base reaches `from_pretrained` as one state dict (worker.py), which ZeRO-3's
        # partitioned build never holds
        return ("qlora with ZeRO-3 is not planned: the random 4-bit base is quantized from one unpartitioned "
                "state dict")
    if scenario.precision != "bf16" or f.compute_dtype != "bf16":
        # LLaMA-Factory has no compute-dtype argument: bf16 training gives bf16, otherwise it
        # picks bf16 or fp16 by what the GPU supports (extras/misc.py infer_optim_dtype), never fp32
        return (f"qlora compute dtype {f.compute_dtype} at precision {scenario.precision}: LLaMA-Factory sets "
                "bitsandbytes' compute dtype from its bf16 switch, so only bf16 compute under bf16 precision is planned")
    return None


class LlamaFactoryBackend(Backend):
    # Its plans have always left output buffering and tokenizer threads to the defaults.
    output_env = False

    def info(self) -> BackendInfo:
        return backend_info()

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        # Structural: no env or machine lifts them, so they are named before what is missing here.
        if scenario.steps.unit == "micro":
            return ("steps.unit micro is not planned for LLaMA-Factory: its trainers count optimizer steps "
                    "(max_steps) and report per optimizer step only")
        if (kv_reason := train_args.v1_kv_head_refusal(scenario)) is not None:
            return kv_reason
        if (adapter_reason := adapter_refusal(scenario)) is not None:
            return adapter_reason
        if (reason := super().check(scenario, machine, env)) is not None:
            return reason
        device = scenario.cluster.device
        has_fa2 = env.has(FLASH_ATTN)
        if scenario.sequence_parallel > 1:
            missing = [what for what, ok in (("a CUDA GPU", device == "cuda" and machine.gpus > 0),
                                             ("flash-attn (flash_attention_2)", has_fa2)) if not ok]
            if missing:
                return (f"sequence_parallel {scenario.sequence_parallel} runs on LLaMA-Factory's v1 trainer "
                        f"(FSDP2, dist_config cp_mode ulysses), which needs {' and '.join(missing)}: missing here")
        if scenario.sequence_parallel > 1 and scenario.attention == "varlen":
            return ("varlen attention with sequence_parallel > 1 is not planned: LLaMA-Factory's v1 trainer "
                    "(the only one with sequence parallel) gets the packed rows with one attention span per row")
        if scenario.attention == "varlen":
            # Without flash-attn, neat_packing builds a dense 4-D block-diagonal mask and computes
            # full attention: correct results, but not the varlen kernel the scenario measures.
            missing = [what for what, ok in (("a CUDA GPU", device == "cuda"), ("flash-attn", has_fa2)) if not ok]
            if missing:
                return ("varlen attention (neat_packing) only uses a varlen kernel with flash-attn on a GPU "
                        f"(else a dense 4-D mask): missing {' and '.join(missing)}")
        if scenario.zero_stage > 0 and not env.has("deepspeed"):
            return f"ZeRO stage {scenario.zero_stage} needs deepspeed, not installed in the llamafactory env"
        return None

    def write_files(self, job: Job, env: BackendEnv) -> dict[str, Path]:
        return train_args.write_run_files(job, flash_attn_installed=env.has(FLASH_ATTN))

    def uses_deepspeed(self, job: Job) -> bool:
        # ZeRO runs on DeepSpeed, which LLaMA-Factory refuses outside a distributed launch: the
        # plan then gives one process a process group too (needs_process_group).
        return job.scenario.zero_stage > 0

    def framework_throughput(self, job: Job, worker: dict) -> dict[str, float]:
        return framework_throughput(job, float(worker.get("fbench_seconds_in_train_runtime") or 0.0))
