"""The XTuner worker: `python -m fbench_xtuner.worker RUN_DIR/job.json`, run with the xtuner env's Python.

It converts the host's packed rows into the dataset the generated config loads, trains
with XTuner's own mmengine Runner, and writes the project's common metrics file (one line
per optimizer step) next to XTuner's own `vis_data/scalars.json`. Any failure raises,
so the process exits non-zero and the host records the run as failed.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path

import mmengine
import numpy as np
import torch
import transformers
import xtuner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from fbench_xtuner import run_layout
from fbench_xtuner.sp_binding import sequence_parallel_problems
from framework_bench.packed import PackedRows, stream_sha256
from framework_bench.worker import settings as capture
from framework_bench.worker.rows import ConsumedRows
from framework_bench.worker_io import MetricsWriter, load_job, publish_dir, write_worker_report

DATA_READY = "fbench-data-sha256"  # written last into the converted dataset's folder
DATA_WAIT_SECONDS = 1800


def convert_rows(job: dict, out_dir: Path) -> tuple[str, int]:
    """Write the packed rows as a HF dataset (`input_ids`, `labels`; -100 = no loss) for `load_from_disk`.

    Verifies that the rows are the stream the host hashed and returns the stream sha256 of
    the token ids and labels read back from the written dataset, i.e. of what XTuner will load.
    """
    import datasets
    import pyarrow as pa

    packed = PackedRows(job["data_dir"])
    marker = out_dir / DATA_READY
    if marker.exists() and marker.read_text() == job["data_sha256"]:
        return marker.read_text(), packed.rows  # converted already (another node sharing run_dir)
    if packed.sha256() != job["data_sha256"]:
        raise RuntimeError(
            f"packed data in {job['data_dir']} has sha256 {packed.sha256()}, the job expects {job['data_sha256']}"
        )
    ctx = packed.context_length

    def fixed_rows(a: np.ndarray) -> pa.Array:
        return pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(a).reshape(-1)), ctx)

    columns = {"input_ids": fixed_rows(packed.input_ids), "labels": fixed_rows(packed.labels)}
    if job["scenario"]["attention"] == "varlen":
        # What XTuner's own packer adds for varlen attention: document boundaries and
        # positions restarting at each document.
        cu = [packed.cu_seqlens(r) for r in range(packed.rows)]
        positions = [np.concatenate([np.arange(b - a) for a, b in zip(c[:-1], c[1:])]) for c in cu]
        columns["cumulative_len"] = pa.array([c.tolist() for c in cu])
        columns["position_ids"] = fixed_rows(np.stack(positions))
    tmp = out_dir.with_name(f"{out_dir.name}.tmp{os.getpid()}")
    datasets.Dataset(pa.table(columns)).save_to_disk(str(tmp))

    written = datasets.load_from_disk(str(tmp)).with_format("numpy")
    sha = stream_sha256(np.asarray(written["input_ids"]), np.asarray(written["labels"]), packed.doc_starts)
    if sha != job["data_sha256"]:
        raise RuntimeError(f"converted dataset {tmp} hashes to {sha}, not {job['data_sha256']}")
    (tmp / DATA_READY).write_text(sha)
    publish_dir(tmp, out_dir)
    return sha, packed.rows


def wait_for_rows(out_dir: Path) -> str:
    """Other local ranks wait for local rank 0's conversion (torch.distributed is not up yet)."""
    marker = out_dir / DATA_READY
    deadline = time.monotonic() + DATA_WAIT_SECONDS
    while not marker.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no converted dataset at {out_dir} after {DATA_WAIT_SECONDS} s")
        time.sleep(1)
    return marker.read_text()


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_mem_bytes(device: str) -> int:
    if device == "cuda":
        return int(torch.cuda.max_memory_allocated())
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _unwrap(model):
    return model.module if is_model_wrapper(model) else model


class StepStart(Hook):
    """Marks the start of each iteration; registered with the lowest priority so that its
    `before_train_iter` runs last, right before the train step."""

    def __init__(self, device: str):
        self.device = device
        self.started = 0.0

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        _sync(self.device)
        self.started = time.perf_counter()


def verify_sequence_parallel(llm, requested: int) -> None:
    """Fail the run unless XTuner's sequence-parallel attention is what the built model runs:
    flash-attention 2, XTuner's dispatched attention forward on every attention module, an
    SP group of the requested size (the check itself: `fbench_xtuner.sp_binding`)."""
    if requested <= 1:
        return
    import torch.distributed as dist
    from transformers.utils.import_utils import is_flash_attn_2_available
    from xtuner.parallel.sequence import get_sequence_parallel_group

    group = get_sequence_parallel_group()
    size = dist.get_world_size(group) if dist.is_initialized() and group is not None else 1
    forwards = [f"{fn.__module__}.{fn.__qualname__}" for m in llm.modules() if type(m).__name__.endswith("Attention")
                for fn in [getattr(m.forward, "__func__", m.forward)]]
    problems = sequence_parallel_problems(requested, flash_attn_available=is_flash_attn_2_available(),
                                          attn_implementation=llm.config._attn_implementation,
                                          attention_forwards=forwards, sp_group_size=size)
    if problems:
        raise RuntimeError(f"XTuner's sequence parallel {requested} is not what would train: " + "; ".join(problems))


class CommonMetrics(Hook):
    """Writes one common-metrics line per optimizer step (grad_accum iterations); registered
    with the highest priority so that its `after_train_iter` runs first, before logging.

    Also checks, once the model is built, that the settings the config asked for really
    took effect: through the Runner, XTuner drops sequence parallel and varlen attention
    without a word when their engines are missing.
    """

    def __init__(self, job: dict, start: StepStart):
        self.scenario = job["scenario"]
        self.device = job["device"]
        self.start = start
        self.writer = MetricsWriter(job["run_dir"])
        self.sp_size = 1
        self.attention_used = None
        self._reset()

    def _reset(self) -> None:
        self.seconds, self.tokens, self.losses, self.micro = 0.0, 0, [], 0

    def before_train(self, runner) -> None:
        from xtuner.parallel.sequence import get_sequence_parallel_world_size

        self.sp_size = get_sequence_parallel_world_size()
        if self.sp_size != self.scenario["sequence_parallel"]:
            raise RuntimeError(
                f"sequence parallel size in effect is {self.sp_size}, the scenario asks for "
                f"{self.scenario['sequence_parallel']}"
            )
        llm = _unwrap(runner.model).llm
        verify_sequence_parallel(llm, self.scenario["sequence_parallel"])
        self.attention_used = llm.config._attn_implementation
        if self.scenario["attention"] == "varlen" and self.attention_used != "flash_attention_2":
            raise RuntimeError(f"varlen attention asked for, but the model uses {self.attention_used!r}")
        runner.logger.info(f"fbench: attention {self.attention_used}, sequence parallel {self.sp_size}")

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        _sync(self.device)
        self.seconds += time.perf_counter() - self.start.started
        # The batch holds whole rows: each rank of a sequence-parallel group trains 1/SP of them.
        self.tokens += data_batch["data"]["input_ids"].numel() // self.sp_size
        self.losses.append(outputs["loss"].detach().item())
        self.micro += 1
        # `steps.unit: micro`: every iteration is a step (the update lands in every grad_accum-th)
        per_step = 1 if self.scenario["steps"].get("unit") == "micro" else self.scenario["grad_accum"]
        if self.micro == per_step:
            step = (runner.iter + 1) // per_step
            self.writer.write(step, self.seconds, self.tokens, sum(self.losses) / len(self.losses),
                              _peak_mem_bytes(self.device))
            self._reset()

    def after_train(self, runner) -> None:
        self.writer.close()


def effective_settings(runner, job: dict, sp_size: int) -> dict:
    """What XTuner really trains with, read from the objects the Runner built."""
    from mmengine.optim import AmpOptimWrapper

    llm = _unwrap(runner.model).llm
    wrapper = runner.optim_wrapper
    strategy = getattr(runner, "strategy", None)
    ds = getattr(strategy, "config", None) if type(strategy).__name__ == "DeepSpeedStrategy" else None
    amp = isinstance(wrapper, AmpOptimWrapper)
    model = capture.model_settings(llm)
    if model["attention"] == "flash_attention_2" and model["attention_kv_repeat"]:
        model["attention_kv_repeat"] = "repeated (XTuner's dispatched flash-attn forward)"
    clip = ds.get("gradient_clipping") if ds else (wrapper.clip_grad_kwargs or {}).get("max_norm")
    return {
        "trainer": "mmengine-flexible+deepspeed" if ds else "mmengine-runner",
        "settings_mode": job.get("settings_mode", "matched"),
        **capture.optimizer_settings(wrapper),
        "grad_clip": clip,
        **model,
        "autocast_dtype": str(wrapper.cast_dtype).removeprefix("torch.") if amp else
        ("bfloat16" if ds and (ds.get("bf16") or {}).get("enabled") else None),
        "loss_scaler": type(wrapper.loss_scaler).__name__ if amp and wrapper.loss_scaler.is_enabled() else "none",
        **capture.precision_recipe(model["param_dtype"], ds),
        **capture.zero_settings(ds),
        **capture.dataloader_settings(runner.train_dataloader),
        "sequence_parallel": sp_size,
        "seed": runner.seed,
        "compile": bool(getattr(runner, "_compile", False)),
        "ddp_find_unused_parameters": getattr(runner.model, "find_unused_parameters", None),  # DDP-wrapped only
        **capture.versions(),
    }


class Claims(Hook):
    """Records what the host verifies (framework_bench/verify.py): the rows fed in each
    optimizer step, read from the data batch (whole rows, before any SP split), the settings
    in effect and the parameter count. Runs after CommonMetrics has closed the step's clock."""

    def __init__(self, job: dict, metrics: CommonMetrics):
        self.job, self.metrics = job, metrics
        self.rows = ConsumedRows(job["run_dir"], int(os.environ.get("RANK", "0")))
        self.micro = 0
        self.settings: dict = {}
        self.param_count: int | None = None

    def before_train(self, runner) -> None:
        self.settings = effective_settings(runner, self.job, self.metrics.sp_size)
        self.param_count = capture.param_count(_unwrap(runner.model).llm)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.rows.add(data_batch["data"]["input_ids"], data_batch["data"]["labels"])
        self.micro += 1
        if self.micro % self.job["scenario"]["grad_accum"] == 0:
            self.rows.end_step(self.micro // self.job["scenario"]["grad_accum"])

    def after_train(self, runner) -> None:
        self.rows.close()


def build_runner(cfg: Config) -> Runner:
    """As `xtuner train` does: DeepSpeed configs name the FlexibleRunner."""
    if "runner_type" in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def main(job_file: str) -> None:
    job = load_job(job_file)
    run_dir = Path(job["run_dir"])
    data_dir = run_dir / run_layout.DATA_DIR
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        trained_sha, rows = convert_rows(job, data_dir)
    else:
        trained_sha, rows = wait_for_rows(data_dir), None

    # xtuner/model/sft.py asks `get_torch_device().is_bf16_supported()`, which on CPU is
    # torch.cpu, and torch.cpu has no is_bf16_supported: answer False (it only picks the
    # dtype for flash-attn, which CPU runs never use).
    if not hasattr(torch.cpu, "is_bf16_supported"):
        torch.cpu.is_bf16_supported = lambda *args, **kwargs: False

    cfg = Config.fromfile(str(run_dir / run_layout.CONFIG_NAME))
    # torchrun sets WORLD_SIZE when the host starts several processes; mmengine's
    # "pytorch" launcher then reads RANK/LOCAL_RANK/MASTER_* from it.
    cfg.launcher = "pytorch" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else "none"
    runner = build_runner(cfg)
    start = StepStart(job["device"])
    metrics = CommonMetrics(job, start)
    runner.register_hook(start, priority="LOWEST")
    runner.register_hook(metrics, priority="HIGHEST")
    claims = Claims(job, metrics)
    runner.register_hook(claims, priority="NORMAL")
    runner.train()

    write_worker_report(
        run_dir,
        data_sha256=trained_sha,
        rows_converted=rows,
        framework_version=xtuner.__version__,
        attention_used=metrics.attention_used,
        sequence_parallel_in_effect=metrics.sp_size,
        deepspeed="strategy" in cfg,
        transformers_version=transformers.__version__,
        mmengine_version=mmengine.__version__,
        torch_version=torch.__version__,
        work_dir=str(runner.log_dir),
        settings=claims.settings,
        param_count=claims.param_count,
    )


if __name__ == "__main__":
    main(sys.argv[1])
