"""The ms-swift backend plugin (host side): what it supports, the files it generates, and
ms-swift's own throughput figure.

Registered through the `fbench.backends` entry point (pyproject.toml). No torch or swift import:
the worker (`fbench_swift.worker`) runs in the backend's env.
"""

from __future__ import annotations

from pathlib import Path

from framework_bench.plugins import hf_trainer_args
from framework_bench.plugins.base import Backend
from framework_bench.plugins.contract import (AdamWImpl, BackendEnv, BackendInfo, Capabilities, EnvSpec, Job,
                                             MemoryScheme, Machine)
from framework_bench.plugins.deepspeed_settings import DEEPSPEED_SPEED_SETTINGS, DEEPSPEED_VERSION_NOTE
from framework_bench.scenario.scenario import Scenario

from fbench_swift import swift_args

NAME = "swift"
HERE = Path(__file__).parent


def backend_info() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        framework="ms-swift",
        description="ms-swift's SFT pipeline (SwiftSft, SftArguments) on the pre-tokenized packed rows",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=True, varlen=False, zero_stages=[0, 1, 2, 3],
                                  lora=True, qlora=False),
        env=EnvSpec(requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
                    framework_package="ms-swift", post_install=["framework_bench.plugins.deepspeed_jit"],
                    supports={"ms-swift": ">=4.0,<5"}),  # swift 4's SftArguments
        # matched: `adamw_torch_fused` on CUDA, `adamw_torch` (torch's choice) on CPU, as the others;
        # native: the HF Trainer's default under SftArguments, `adamw_torch_fused`, on either device.
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused", cpu="fused")}),
        contract=5,  # the plugin contract it is written against: every claim made, the warm-up's projection included
        speed_settings=DEEPSPEED_SPEED_SETTINGS,
        report_notes=[
            DEEPSPEED_VERSION_NOTE,
            "ms-swift 4.6 runs on transformers 5.6, peft 0.18.1 and trl 0.24, LLaMA-Factory's env's releases.",
            "ms-swift's Seq2SeqTrainer computes each micro-batch's token accuracy from the logits' argmax, "
            "copied to the host (swift/metrics/acc.py), its logged `token_acc`: a device sync inside every step, "
            "part of its step.",
            "ms-swift's logits_to_keep (the LM head over the labelled positions only) is off in both modes: it "
            "rewrites the labels the model is fed, which the host's rows check reads.",
        ],
    )


class SwiftBackend(Backend):
    def info(self) -> BackendInfo:
        return backend_info()

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        return (super().check(scenario, machine, env) or hf_trainer_args.refusal(scenario, env)
                or swift_args.refusal(scenario))

    def write_files(self, job: Job, env: BackendEnv) -> dict[str, Path]:
        return swift_args.write_run_files(job, flash_attn_installed=env.has("flash-attn"))

    def uses_deepspeed(self, job: Job) -> bool:
        return job.scenario.zero_stage > 0
