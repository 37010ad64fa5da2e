"""The XTuner backend: XTuner 0.2.0's own mmengine Runner, in the env `.fbench/envs/xtuner`.

Host side only: nothing here imports torch or xtuner (the worker does, inside the env).
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean, median

from framework_bench.plugins.contract import (AdamWImpl, BackendEnv, BackendInfo, Capabilities, EnvSpec, Job,
                                             Machine, MemoryScheme)
from framework_bench.plugins.base import Backend
from framework_bench.plugins.deepspeed_settings import DEEPSPEED_SPEED_SETTINGS, DEEPSPEED_VERSION_NOTE
from framework_bench.scenario.scenario import Scenario

from fbench_xtuner import mmengine_config, run_layout

HERE = Path(__file__).resolve().parent


def backend_info() -> BackendInfo:
    return BackendInfo(
        name="xtuner",
        framework="XTuner",
        description="XTuner 0.2.0 (mmengine Runner, SupervisedFinetune) on the shared packed rows",
        capabilities=Capabilities(cpu=True, gpu=True, sequence_parallel=True, varlen=True, zero_stages=[0, 1, 2, 3],
                                  lora=True, qlora=True),
        env=EnvSpec(
            requirements={"cpu": HERE / "requirements-cpu.txt", "cuda": HERE / "requirements-cuda.txt"},
            framework_package="xtuner",
            post_install=["fbench_xtuner.env_fixups", "framework_bench.plugins.deepspeed_jit"],
            supports={"xtuner": ">=0.2.0,<0.3"},  # the mmengine line's config and runner as 0.2.0 has them
        ),
        # matched: the config asks torch AdamW for fused=True on CUDA; native: XTuner's configs
        # name AdamW with no flag, which torch runs as foreach on CUDA. Sequence parallel runs
        # on XTuner's DeepSpeed strategy (the client AdamW as configured).
        memory=MemoryScheme(adamw={"matched": AdamWImpl(cuda="fused"), "native": AdamWImpl(cuda="foreach")},
                            sequence_parallel="deepspeed"),
        contract=5,  # the plugin contract it is written against: every claim made, the warm-up's projection included
        speed_settings=DEEPSPEED_SPEED_SETTINGS,
        report_notes=[
            DEEPSPEED_VERSION_NOTE,
            "XTuner without DeepSpeed clips gradients through mmengine, which reads the norm back to the host "
            "(float(grad_norm)) every step; the HF Trainer does it only under DeepSpeed.",
            "XTuner computes the loss over a shifted contiguous fp32 copy of the logits; the HF Trainer's loss "
            "does not copy.",
            "XTuner 0.2.0 pins transformers 4.48.",
            "Sequence-parallel rows: XTuner has sequence parallelism only through DeepSpeed ZeRO + its Ulysses.",
        ],
        manifest_packages=["mmengine"],
    )


def _missing(env: BackendEnv, *distributions: str) -> list[str]:
    return [d for d in distributions if not env.has(d)]


def scalars_file(run_dir: Path) -> Path | None:
    """XTuner's own per-iteration log: `<work_dir>/<timestamp>/vis_data/scalars.json` (newest run)."""
    found = sorted((run_dir / run_layout.WORK_DIR).glob("*/vis_data/scalars.json"))
    return found[-1] if found else None


def framework_throughput(job: Job) -> dict[str, float]:
    """XTuner's ThroughputHook figures over the measured iterations (warm-up skipped): means,
    and medians to set beside the host's TGS, which is the median over steps."""
    path = scalars_file(job.run_dir)
    if path is None:
        return {}
    warmup_iters = job.scenario.steps.warmup * job.scenario.micro_per_step
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    measured = [r for r in rows if "tokens_per_sec" in r and r["iter"] > warmup_iters]
    if not measured:
        return {}
    return {
        "tokens_per_sec": mean(r["tokens_per_sec"] for r in measured),
        "tflops": mean(r["tflops"] for r in measured),
        "tokens_per_sec_median": median(r["tokens_per_sec"] for r in measured),
        "tflops_median": median(r["tflops"] for r in measured),
        "iter_seconds": mean(r["time"] for r in measured),
        "iters": float(len(measured)),
    }


class XTunerBackend(Backend):
    def info(self) -> BackendInfo:
        return backend_info()

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        if (reason := super().check(scenario, machine, env)) is not None:
            return reason
        device = scenario.cluster.device
        # Through the Runner, XTuner silently trains with SP 1 and plain causal attention when
        # these engines are missing (`xtuner train` asserts, the Runner does not): refuse.
        sp = scenario.sequence_parallel
        if sp > 1:
            missing = _missing(env, "flash_attn", "deepspeed")
            if device != "cuda" or missing:
                needs = "a CUDA GPU" if device != "cuda" else "flash_attn and deepspeed"
                lacking = f" ({', '.join(missing)} not installed in the xtuner env)" if missing else ""
                return (f"sequence_parallel {sp} needs {needs}{lacking}: XTuner's sequence parallel runs only "
                        "through its DeepSpeed strategy with flash-attn, and otherwise trains with SP 1 without a word")
        if scenario.attention == "varlen":
            if device != "cuda" or not env.has("flash_attn"):
                return ("varlen attention needs flash_attn on a CUDA GPU: without it XTuner silently "
                        "falls back to causal attention across the packed documents")
            if scenario.micro_batch != 1:
                return f"varlen attention in XTuner takes micro_batch 1, not {scenario.micro_batch}"
        if scenario.finetune.method != "full" and scenario.zero_stage == 3:
            # Both steps fbench adds to XTuner's LoRA path work on whole tensors: the matched cast
            # of the frozen weights, and the 4-bit quantization of a model built from its config
            # (XTuner's own QLoRA under ZeRO-3 loads pre-partitioned weights, which fbench has not).
            return (f"{scenario.finetune.method} with ZeRO stage 3 is not supported by fbench's XTuner backend: "
                    "its adapter setup reads and casts whole weights, which ZeRO-3 has already partitioned")
        if scenario.zero_stage and not env.has("deepspeed"):
            return f"ZeRO stage {scenario.zero_stage} needs deepspeed, not installed in the xtuner env"
        if device == "cpu":
            if scenario.cluster.gpus > 1 and not scenario.zero_stage:
                # Without DeepSpeed, mmengine 0.10.6's Runner.wrap_model always gives DDP
                # device_ids=[LOCAL_RANK] (runner.py), which DDP refuses for a module on the CPU.
                # With ZeRO the FlexibleRunner's DeepSpeed engine does the data parallelism (gloo)
                # and runs: multiproc_tiny_cpu_zero2/3.
                return (f"{scenario.cluster.gpus} CPU processes at ZeRO 0: mmengine's DDP wrapper passes "
                        "device_ids=[LOCAL_RANK], which DDP refuses for a CPU model; CPU data parallel "
                        "runs through DeepSpeed (zero_stage 1-3) only")
            if scenario.precision == "bf16":
                # Not emulated: casting the whole model to bf16 would be another setting than the
                # GPU runs' bf16 autocast, and on a CPU without bf16 units it is ~15x slower.
                return "bf16 runs through XTuner's AmpOptimWrapper, which refuses CPU; use precision fp32 on CPU"
        return None

    def write_files(self, job: Job, env: BackendEnv) -> dict[str, Path]:
        return mmengine_config.write(job)

    def uses_deepspeed(self, job: Job) -> bool:
        return mmengine_config.uses_deepspeed(job)

    def framework_throughput(self, job: Job, worker: dict) -> dict[str, float]:
        return framework_throughput(job)
