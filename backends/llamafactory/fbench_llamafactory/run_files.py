"""Where things live in a LLaMA-Factory run folder; shared by the plugin (host) and the worker.

Stdlib only: imported on both sides. (`publish_once`, once here, is the worker SDK's now.)
"""

from __future__ import annotations

from pathlib import Path

TRAIN_ARGS = "llamafactory_train.json"      # v0 `run_exp` arguments (also runnable by `llamafactory-cli train`)
TRAIN_ARGS_V1 = "llamafactory_v1_train.json"  # v1 trainer arguments (sequence parallel)
DEEPSPEED = "deepspeed.json"
TOKENIZED_DIR = "tokenized"           # DatasetDict{"train"} written by the worker (v0)
V1_DATA = "train.parquet"             # the same rows as one parquet file (v1 data engine)
OUTPUT_DIR = "output"                 # LLaMA-Factory's output_dir: trainer_log.jsonl lands here
TRAIN_RESULTS = "train_results.json"  # the HF Trainer's end-of-training metrics (train_runtime)
# LLaMA-Factory's v1 initialisation plugin the plan asks for: global rank 0 builds the model
# in host memory, every other rank on the meta device; FSDP2 shards it and broadcasts rank
# 0's weights (fsdp2.py `shard_model`). No GPU ever holds the full fp32 model.
V1_INIT = "init_on_rank0"


def uses_v1_trainer(sequence_parallel: int) -> bool:
    """Only the v1 trainer (FSDP2) has sequence parallelism (Ulysses) in LLaMA-Factory 0.9.5."""
    return sequence_parallel > 1


def args_file(run_dir: Path, sequence_parallel: int) -> Path:
    return Path(run_dir) / (TRAIN_ARGS_V1 if uses_v1_trainer(sequence_parallel) else TRAIN_ARGS)
