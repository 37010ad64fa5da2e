"""The torch backend (host side): the no-framework reference, a plain PyTorch loop.

Whatever a framework adds on top of PyTorch (its trainer, hooks, data pipeline, wrappers)
shows as the gap between its TGS and this backend's on the same scenario. Nothing here
imports torch: the worker (`fbench_torch.worker`) runs in the env `.fbench/envs/torch`.
"""

from __future__ import annotations

from pathlib import Path

from framework_bench.plugins.contract import (AdamWImpl, BackendEnv, BackendInfo, Capabilities, EnvSpec, Job,
                                              Machine, MemoryScheme)
from framework_bench.plugins.base import Backend
from framework_bench.scenario.scenario import Scenario

NAME = "torch"
HERE = Path(__file__).resolve().parent


def backend_info() -> BackendInfo:
    return BackendInfo(
        name=NAME,
        framework="PyTorch",
        description="the reference: a plain PyTorch loop (HF model from config, AdamW, autocast, DDP; ZeRO-2/3 "
        "as FSDP2; sequence parallel as DeepSpeed-Ulysses) on the shared packed rows",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=True, varlen=False, zero_stages=[0, 2, 3],
                                  lora=True, qlora=True),
        env=EnvSpec(
            requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
            framework_package="torch",
        ),
        # The reference has no framework default to keep: fused AdamW on CUDA in both modes
        # (the worker sets `fused=True` there), torch's own choice on CPU.
        # Its sequence parallel shards as its ZeRO does: FSDP2 over fp32 weights.
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="fused")},
                            sequence_parallel="fsdp2"),
        contract=5,  # the plugin contract it is written against: every claim made, the warm-up's projection included
        reference=True,
    )


class TorchBackend(Backend):
    """The reference is one plain loop, ZeRO-2/3 as FSDP2 shards it, sequence parallel as
    Ulysses splits it: what it does not implement (ZeRO-1, a per-document varlen kernel,
    adapters on a sharded model) it
    does not declare or refuses (`check`), rather than run something else under the scenario's
    name; the base checks env and GPUs."""

    # As its plans always were: no CUDA_VISIBLE_DEVICES (the loop takes cuda:LOCAL_RANK), and no
    # world-of-one variables but under ZeRO (the loop joins a process group only when a launcher
    # or those made one).
    pin_gpus = False

    def info(self) -> BackendInfo:
        return backend_info()

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        if (reason := super().check(scenario, machine, env)) is not None:
            return reason
        if scenario.zero_stage and scenario.finetune.method != "full":
            return (f"{scenario.finetune.method} with ZeRO stage {scenario.zero_stage} is not implemented by the torch "
                    "reference: it shards full fine-tuning only")
        return None

    def needs_process_group(self, job: Job) -> bool:
        return job.scenario.zero_stage > 0  # FSDP2 shards over a process group, a world of one's too

    def framework_throughput(self, job: Job, worker: dict) -> dict[str, float]:
        # The loop's own clock over the measured steps (the worker's `loop_throughput`).
        return worker.get("loop_throughput", {})
