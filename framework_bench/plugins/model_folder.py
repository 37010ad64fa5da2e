"""The HF model folder a framework builds its model from (host side): the job's config.json and
the packed data's tokenizer files, no weights (every backend trains from random weights it
fills with the shared initial ones)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from framework_bench.plugins.contract import Job
from framework_bench.worker.packed import TOKENIZER_DIR

MODEL_DIR = "model"


def write_model_dir(job: Job, dtype: str | None = None) -> Path:
    """`RUN_DIR/model`, its config.json naming `dtype` where given (the dtype `from_config` and
    `from_pretrained(torch_dtype="auto")` build in)."""
    model_dir = Path(job.run_dir) / MODEL_DIR
    model_dir.mkdir(parents=True, exist_ok=True)
    config = job.hf_config if dtype is None else {**job.hf_config, "dtype": dtype}
    (model_dir / "config.json").write_text(json.dumps(config, indent=2))
    for f in (Path(job.data_dir) / TOKENIZER_DIR).iterdir():
        if f.is_file():
            shutil.copy2(f, model_dir / f.name)
    return model_dir
