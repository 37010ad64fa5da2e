"""The TRL backend plugin (host side): what it supports, the files it generates, and TRL's
own throughput figure.

Registered through the `fbench.backends` entry point (pyproject.toml). No torch or trl import:
the worker (`fbench_trl.worker`) runs in the backend's env.
"""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from framework_bench.plugins import hf_trainer_args
from framework_bench.plugins.base import Backend
from framework_bench.plugins.contract import (AdamWImpl, BackendEnv, BackendInfo, Capabilities, EnvSpec, Job,
                                             Machine, MemoryScheme)
from framework_bench.plugins.deepspeed_settings import DEEPSPEED_SPEED_SETTINGS, DEEPSPEED_VERSION_NOTE
from framework_bench.scenario.scenario import Scenario

from fbench_trl import sft_args

NAME = "trl"
HERE = Path(__file__).parent
# TRL's `deepspeed` extra's floor: a layer over the CPU env with it trains ZeRO-3 there, refereed
# `ok` (docs/calibration.md, "ZeRO-3: what a rank holds once ms-swift or TRL built the model")
DEEPSPEED_LAYER = "deepspeed==0.18.6"
# TRL's sequence parallel is accelerate's (ParallelismConfig, from 1.12) around DeepSpeed's Ulysses
SEQUENCE_PARALLEL_LAYER = "accelerate==1.12.0@deepspeed==0.18.6"


def backend_info() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        framework="TRL",
        description="TRL's SFTTrainer (SFTConfig, peft_config) on the pre-tokenized packed rows",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=True, varlen=False, zero_stages=[0, 1, 2, 3],
                                  lora=True, qlora=False),
        env=EnvSpec(requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
                    # TRL 1's SFTConfig; TRL 1.16 asks transformers >= 4.56.2
                    framework_package="trl", supports={"trl": ">=1.0,<2", "transformers": ">=4.56.2"}),
        # matched: `adamw_torch_fused` on CUDA, `adamw_torch` (torch's choice) on CPU, as the others;
        # native: SFTConfig's default, `adamw_torch_fused`, on either device.
        # SFTTrainer's fused LM head (trl/trainer/utils.py add_fused_lm_head) projects in tiles of
        # TOKEN_CHUNK_SIZE tokens x _CHUNKED_LOGPROB_CHUNK_SIZE vocabulary entries (TRL 1.16)
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused", cpu="fused")},
                            lm_head_tile=(4096, 32768)),
        contract=5,  # the plugin contract it is written against: every claim made, the warm-up's projection included
        speed_settings=DEEPSPEED_SPEED_SETTINGS,
        report_notes=[
            DEEPSPEED_VERSION_NOTE,
            "TRL 1.16 runs on transformers 5.6, the release under LLaMA-Factory's HF Trainer.",
            "TRL's SFTTrainer computes its loss through a fused LM head that also yields each token's entropy and "
            "top-1 accuracy, gathered and read on the host every micro-batch (its logged metrics): part of its step.",
        ],
    )


def sequence_parallel_refusal(scenario: Scenario, env: BackendEnv) -> str | None:
    """Why TRL cannot run this scenario's sequence parallel in `env`, or None."""
    sp = scenario.sequence_parallel
    if sp == 1:
        return None
    accelerate = env.version("accelerate")
    if accelerate is None or Version(accelerate) < Version("1.12") or not env.has("deepspeed"):
        return (f"sequence_parallel {sp}: TRL's sequence parallel is DeepSpeed's Ulysses (ALST) through accelerate's "
                f"ParallelismConfig, from accelerate 1.12, and the {env.name} env has accelerate {accelerate}"
                f"{'' if env.has('deepspeed') else ' and no deepspeed'}; `--backends {env.name}@{SEQUENCE_PARALLEL_LAYER}` "
                "runs it in a layer over that env")
    if scenario.zero_stage == 0:
        return (f"sequence_parallel {sp} with zero_stage 0: accelerate sets TRL's sequence parallel up inside DeepSpeed "
                "only; give a ZeRO stage")
    if sp < scenario.cluster.gpus:
        # accelerate shards the loader over every process and DeepSpeed's adapter trains a group's
        # rows one per step, so each step's rows are not the scenario's (step 1: rows 0 and SP, ...)
        return (f"sequence_parallel {sp} of {scenario.cluster.gpus} processes: beside data parallel, TRL's loader "
                "(accelerate's, sharded over every process) and DeepSpeed's Ulysses adapter (a group's rows one per "
                "step) train each step's rows in another order than the scenario's, which the referee would judge "
                "as different rows; SP over every process runs")
    return None


class TrlBackend(Backend):
    def info(self) -> BackendInfo:
        return backend_info()

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        return (super().check(scenario, machine, env) or sequence_parallel_refusal(scenario, env)
                or hf_trainer_args.refusal(scenario, env, DEEPSPEED_LAYER))

    def write_files(self, job: Job, env: BackendEnv) -> dict[str, Path]:
        return sft_args.write_run_files(job, flash_attn_installed=env.has("flash-attn"))

    def uses_deepspeed(self, job: Job) -> bool:
        return job.scenario.zero_stage > 0
