"""The update after training (issue 20, item 5): the host reveals the projection seed only once
every rank's last step ended; the worker SDK projects (final - initial weights) onto that
seed's vector (checked here against numpy on a real HF Llama in the torch env); the host checks
the claim and compares it with the reference's. The lies it catches run in
tests/test_model_lies.py."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from fbench_fixtures import backend_env_or_skip

from framework_bench.measure import clock, update
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.spec import scenario
from framework_bench.worker import initial_weights_host as iw
from framework_bench.worker import update as worker_update
from framework_bench.worker.files import CLOCK_DIR, REVEAL_FILE, UPDATE_FILE


def write_lines(run_dir, rank, *events):
    with (run_dir / CLOCK_DIR / f"rank{rank}.jsonl").open("a") as fh:
        for event, step in events:
            fh.write(json.dumps({"event": event, "step": step}) + "\n")


def wait_until(predicate, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_the_seed_is_revealed_only_after_every_rank_ended_the_last_step(tmp_path):
    reveal = update.Reveal(after_step=3, ranks=2, seed=12345)
    revealed = tmp_path / REVEAL_FILE
    with clock.Watcher(tmp_path, warmup=1, cpu=False, reveal=reveal) as watcher:
        for step in (1, 2, 3):
            write_lines(tmp_path, 0, ("begin", None), ("end", step))
        for step in (1, 2):
            write_lines(tmp_path, 1, ("begin", None), ("end", step))
        assert wait_until(lambda: len(watcher.events.get(1, [])) == 4)
        time.sleep(0.1)
        assert not revealed.exists()  # rank 1 is still in its last step
        write_lines(tmp_path, 1, ("begin", None), ("end", 3))
        assert wait_until(revealed.exists)
    assert json.loads(revealed.read_text()) == {"projection_seed": 12345}
    stamps = clock.load_stamps(tmp_path)
    assert stamps["reveal"]["seed"] == 12345
    assert stamps["reveal"]["stamp"] == stamps["ranks"]["1"][-1][0]  # revealed on the stamp of rank 1's end


def test_the_worker_waits_for_the_reveal_and_gives_up_without_one(tmp_path):
    assert worker_update.wait_for_reveal(tmp_path, timeout=0.1) is None
    update.Reveal(after_step=1, ranks=1, seed=7).write(tmp_path)
    assert worker_update.wait_for_reveal(tmp_path, timeout=0.1) == 7


def test_the_projection_seed_is_one_per_scenario_and_seed_in_a_process_and_secret_across_processes():
    a = update.projection_seed("tiny_cpu", 1024)
    assert a == update.projection_seed("tiny_cpu", 1024)
    assert a != update.projection_seed("tiny_cpu", 1025) and a != update.projection_seed("tiny_cpu_1k", 1024)
    other = subprocess.run([sys.executable, "-c", "from framework_bench.measure import update; "
                            "print(update.projection_seed('tiny_cpu', 1024))"], capture_output=True, text=True, check=True)
    assert int(other.stdout) != a  # another fbench process: another secret


def claimed(run_dir, seed, value):
    (run_dir / UPDATE_FILE).write_text(json.dumps({"projection_seed": seed, "projection": value, "seconds": 0.1}))


def test_the_update_check(tmp_path):
    stamps = {"reveal": {"seed": 5, "stamp": 1.0}}
    assert update.check(tmp_path, stamps).status == "unverified"
    claimed(tmp_path, 5, -4.9e-3)
    assert update.check(tmp_path, None).status == "unverified"
    ok = update.check(tmp_path, stamps)
    assert ok.status == "pass" and ok.figures["projection"] == -4.9e-3
    claimed(tmp_path, 6, -4.9e-3)
    wrong = update.check(tmp_path, stamps)
    assert wrong.status == "fail" and "the host revealed 5" in wrong.detail
    claimed(tmp_path, 5, 0.0)
    still = update.check(tmp_path, stamps)
    assert still.status == "fail" and "never changed" in still.detail


def result(backend, projection, normalisation="token mean", curve=None, seed=5):
    check = Check(name="update", status="pass", figures={"projection_seed": seed, "projection": projection})
    return RunResult(backend=backend, scenario="s", status="ok", checks=[check], settings={"loss_normalization": normalisation},
                     loss_curve=curve or {1: 6.0, 2: 5.9})


def test_update_parity_is_judged_where_both_trained_alike():
    reference = result("torch", -4.964129e-03)
    assert update.parity(result("x", -4.964279e-03), reference, "fp32").status == "pass"
    far = update.parity(result("x", -4.0e-03), reference, "fp32")
    assert far.status == "fail" and "moved otherwise" in far.detail
    # Another wording of the normalisation with equal losses at every step: judged all the same.
    assert update.parity(result("x", -4.0e-03, "mean per micro-batch"), reference, "fp32").status == "fail"
    # Another normalisation whose curve parts from the reference's: shown, not judged.
    other = update.parity(result("x", -1.85e-02, "mean per micro-batch", {1: 6.0, 2: 5.8}), reference, "fp32")
    assert other.status == "skipped" and other.figures["reference_projection"] == -4.964129e-03
    assert update.parity(result("x", -4.9e-3, seed=6), reference, "fp32").status == "skipped"
    failed = reference.model_copy(update={"checks": []})
    assert update.parity(result("x", -4.9e-3), failed, "fp32") is None


PROJECT = """
import json, sys, torch, transformers
from framework_bench.worker import initial_weights_worker, update
cfg = json.loads(sys.argv[1])
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
model = transformers.AutoModelForCausalLM.from_config(config)
initial_weights_worker.fill(model, 1024, config.to_dict())
untouched = update.project(model, 1024, config.to_dict(), 99)
with torch.no_grad():
    model.model.layers[1].mlp.up_proj.weight[3, :5] += torch.arange(1.0, 6.0)
    model.model.norm.weight[7] -= 0.5
moved = update.project(model, 1024, config.to_dict(), 99)
print(json.dumps({"untouched": untouched, "moved": moved, "up": model.model.layers[1].mlp.up_proj.weight.shape[1]}))
"""


def test_the_torch_projection_is_the_numpy_sum_over_the_changed_elements():
    """Elements never updated add exactly 0 (the initial values are recomputed as `fill` stored
    them); the changed ones add their change times the seed's vector, as numpy computes it."""
    env = backend_env_or_skip("torch")
    cfg = scenario.load("tiny_cpu").model_config_for_run
    out = subprocess.run([str(env.python), "-c", PROJECT, json.dumps(cfg)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["untouched"] == 0.0
    up = "model.layers.1.mlp.up_proj.weight"
    v_up = iw.standard_normal(3 * got["up"] + np.arange(5), iw.projection_key(99, up))
    v_norm = iw.standard_normal(np.array([7]), iw.projection_key(99, "model.norm.weight"))
    # the float32 rounding of (initial + change) - initial: within 1e-7 of the change
    want = float(np.dot(np.arange(1.0, 6.0), v_up) - 0.5 * v_norm[0])
    assert got["moved"] == pytest.approx(want, rel=1e-6)
