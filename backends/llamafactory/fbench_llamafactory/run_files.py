"""Where things live in a LLaMA-Factory run folder; shared by the plugin (host) and the worker.

Stdlib only: imported on both sides.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from pathlib import Path

TRAIN_ARGS = "llamafactory_train.json"      # v0 `run_exp` arguments (also runnable by `llamafactory-cli train`)
TRAIN_ARGS_V1 = "llamafactory_v1_train.json"  # v1 trainer arguments (sequence parallel)
DEEPSPEED = "deepspeed.json"
MODEL_DIR = "model"                   # config.json + tokenizer files; no weights (random init)
TOKENIZED_DIR = "tokenized"           # DatasetDict{"train"} written by the worker (v0)
V1_DATA = "train.parquet"             # the same rows as one parquet file (v1 data engine)
OUTPUT_DIR = "output"                 # LLaMA-Factory's output_dir: trainer_log.jsonl lands here
TRAIN_RESULTS = "train_results.json"  # the HF Trainer's end-of-training metrics (train_runtime)
WAIT_FOR_FILES_S = 900
# LLaMA-Factory's v1 initialisation plugin the plan asks for: global rank 0 builds the model
# in host memory, every other rank on the meta device; FSDP2 shards it and broadcasts rank
# 0's weights (fsdp2.py `shard_model`). No GPU ever holds the full fp32 model.
V1_INIT = "init_on_rank0"


def uses_v1_trainer(sequence_parallel: int) -> bool:
    """Only the v1 trainer (FSDP2) has sequence parallelism (Ulysses) in LLaMA-Factory 0.9.5."""
    return sequence_parallel > 1


def args_file(run_dir: Path, sequence_parallel: int) -> Path:
    return Path(run_dir) / (TRAIN_ARGS_V1 if uses_v1_trainer(sequence_parallel) else TRAIN_ARGS)


def is_local_main() -> bool:
    """Local rank 0 writes the shared inputs (tokenized rows, weights); the other ranks wait."""
    return int(os.environ.get("LOCAL_RANK", "0")) == 0


def wait_for(path: Path, seconds: float = WAIT_FOR_FILES_S) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path} (written by another rank: see {path.name}.lock)")
        time.sleep(0.2)


def publish_once(target: Path, write: Callable[[Path], None], wait_s: float = WAIT_FOR_FILES_S) -> bool:
    """One writer per shared run folder, however many nodes share it: the process that
    creates `<target>.lock` first (O_CREAT | O_EXCL: one winner, on a shared filesystem
    too) calls `write(tmp)` with a temporary name unique to its host and pid, then renames
    it into place (atomic); every other process waits for `target`. Readers therefore never
    see a half-written file. Returns True in the writer."""
    target = Path(target)
    if target.exists():
        return False
    lock = target.with_name(target.name + ".lock")
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        wait_for(target, wait_s)
        return False
    with os.fdopen(fd, "w") as fh:  # kept: it names the writer, for a waiter that times out
        fh.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    tmp = target.with_name(f"{target.name}.tmp.{socket.gethostname()}.{os.getpid()}")
    write(tmp)
    os.replace(tmp, target)
    return True
