"""Worker of the fake backends: writes real metrics files, then ends as its mode says.

`ok` claims only what holds: the rows it read (through the SDK's consumed-rows record), the
tokens they hold, every step, the parameter count of the scenario's config, its settings.
The other training modes each tell one lie the host must catch (framework_bench/verify.py).
"""

import os
import signal
import sys
import time

import numpy as np

from framework_bench.packed import PackedRows
from framework_bench.worker.rows import ConsumedRows
from framework_bench.worker_io import MetricsWriter, load_job, write_worker_report


def param_count(cfg: dict) -> int:
    """What a Llama built from the job's config.json has (the fake builds no model)."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    return layers * (2 * h * h + 2 * h * kv + 3 * h * cfg["intermediate_size"] + 2 * h) + 2 * vocab * h + h


job_file, mode = sys.argv[1], sys.argv[2]
job = load_job(job_file)
if mode == "crash":
    print("Traceback (most recent call last):\nRuntimeError: the fake trainer fell over", file=sys.stderr)
    sys.exit(1)
if mode == "hang":
    time.sleep(120)
if mode == "interrupt":
    os.kill(os.getppid(), signal.SIGINT)  # as if the user pressed Ctrl-C in the host
    time.sleep(120)
if mode == "stubborn":  # slow to stop: ignores SIGTERM, so the host waits before its SIGKILL
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.kill(os.getppid(), signal.SIGINT)
    time.sleep(120)
ctx = job["scenario"]["context_length"]
writer = MetricsWriter(job["run_dir"])
consumed = ConsumedRows(job["run_dir"], rank=0)
steps = job["scenario"]["steps"]
if mode == "echo_sha":  # never opens the data: "trains" on zeros and echoes the host's sha256
    rows_ids = rows_labels = np.zeros((steps["warmup"] + steps["measured"] + 1, ctx), np.int32)
    sha = job["data_sha256"]
else:
    rows = PackedRows(job["data_dir"])
    rows_ids, rows_labels, sha = rows.input_ids, rows.labels, rows.sha256()
first_row = 1 if mode == "wrong_rows" else 0  # skips the stream's first row
for step in range(1, steps["warmup"] + steps["measured"] + 1):
    if mode == "missing_steps" and step == 3:
        continue
    row = first_row + step - 1
    consumed.add(rows_ids[row], rows_labels[row])
    consumed.end_step(step)
    writer.write(step, 0.5, ctx * (2 if mode == "double_tokens" else 1), 10.0 / step, None)
params = param_count(job["hf_config"]) - (job["hf_config"]["hidden_size"] if mode == "wrong_model" else 0)
write_worker_report(job["run_dir"], data_sha256=sha, param_count=params, settings={
    "trainer": f"fake-loop-{mode}", "optimizer": "torch.optim.AdamW", "optimizer_impl": "for-loop", "param_dtype": "float32",
    "attention": "none", "activation_checkpointing": False, "zero_stage": 0})
