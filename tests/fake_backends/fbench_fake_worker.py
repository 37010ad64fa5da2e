"""Worker of the fake backends: writes real metrics files, then ends as its mode says."""

import os
import signal
import sys
import time

from framework_bench.packed import PackedRows
from framework_bench.worker_io import MetricsWriter, load_job, write_worker_report

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
rows = PackedRows(job["data_dir"])
writer = MetricsWriter(job["run_dir"])
steps = job["scenario"]["steps"]
for step in range(1, steps["warmup"] + steps["measured"] + 1):
    writer.write(step, 0.5, rows.context_length, 10.0 / step, None)
write_worker_report(job["run_dir"], data_sha256=rows.sha256())
