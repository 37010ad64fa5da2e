"""benchmarks/gpu_check.sh --dry: the one-GPU check's plans, made on this GPU-less machine
(the real mode needs an NVIDIA GPU and is not run in CI)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("tiny_cuda", "llama2_7b_8k_1gpu", "llama2_7b_32k_1gpu", "llama2_7b_8k_1gpu_zero3")


def test_dry_mode_plans_every_check(fbench_home):
    fbench = str(Path(sys.executable).with_name("fbench"))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # plans then pin GPU 0
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry"], capture_output=True, text=True,
                         env={**env, "FBENCH": fbench, "COLUMNS": "300"}, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for name in SCENARIOS:
        assert f"{name}: 1 node(s) x 1 cuda" in text
    for backend in ("xtuner", "llamafactory"):
        assert text.count(f"{backend} via local") == len(SCENARIOS)
    # every one-GPU plan starts a process group of one and pins one GPU
    assert text.count("env:  WORLD_SIZE=1") == 2 * len(SCENARIOS)
    assert text.count("env:  CUDA_VISIBLE_DEVICES=0") == 2 * len(SCENARIOS)
    assert "Traceback" not in out.stderr


def test_real_mode_refuses_without_a_gpu_or_wheels(tmp_path):
    script = str(ROOT / "benchmarks" / "gpu_check.sh")
    out = subprocess.run(["bash", script], capture_output=True, text=True)
    assert out.returncode == 2 and "needs --wheels" in out.stderr
