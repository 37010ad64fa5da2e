"""How long a worker's process takes to end once its report is written: the interpreter's own
teardown with torch and transformers loaded (a tiny Llama trained one step), against
`framework_bench.worker.exit_now`. Runs in a backend's env; prints the seconds from the last
line of work to the process's end, each way, three times.

    .venv/bin/python benchmarks/worker_exit.py [ENV]   (ENV: a backend's env, default .fbench/envs/torch)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

WORK = """
import sys, time
import torch, transformers
cfg = transformers.AutoConfig.for_model("llama", hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=3000)
model = transformers.AutoModelForCausalLM.from_config(cfg)
ids = torch.randint(0, 3000, (1, 512))
model(input_ids=ids, labels=ids).loss.backward()
torch.optim.AdamW(model.parameters()).step()
print(time.time(), flush=True)
if sys.argv[1] == "exit_now":
    from framework_bench.worker import exit_now
    exit_now()
"""


def main() -> None:
    env = Path(sys.argv[1] if len(sys.argv) > 1 else ".fbench/envs/torch")
    python = env / "bin" / "python"
    for _ in range(3):
        for way in ("teardown", "exit_now"):
            out = subprocess.run([str(python), "-c", WORK, way], capture_output=True, text=True, check=True,
                                 env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
            ended = time.time()
            print(f"{way:9s} {ended - float(out.stdout.split()[-1]):.2f} s from the last line of work to the end")


if __name__ == "__main__":
    main()
