"""The update after training: the host reveals the projection seed only once
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

from framework_bench.measure import clock, clock_checks, reveal_checks, update
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check
from framework_bench.scenario import scenario
from framework_bench.worker import LEARNING_RATE
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
    reveal = update.Reveal(after_step=3, ranks=2, seed=12345, initial_seed=54321)
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
    stamps = clock_checks.load_stamps(tmp_path)
    assert stamps["reveal"]["seed"] == 12345
    assert stamps["reveal"]["stamp"] == stamps["ranks"]["1"][-1][0]  # revealed on the stamp of rank 1's end


def test_the_initial_seed_is_revealed_once_every_rank_is_ready_and_the_time_to_the_first_step_judged(tmp_path):
    """The watcher reveals the trained weights' seed on the stamp of the last rank's ready line; the
    initial_reveal check then reads the seconds from there to the last rank's first step, and fails
    a step begun before the reveal or weights filled from another seed."""
    from framework_bench.worker.files import INITIAL_REVEAL_FILE
    from framework_bench.worker.initial_weights_host import REPORT_FILE

    revealed = tmp_path / INITIAL_REVEAL_FILE
    with clock.Watcher(tmp_path, warmup=0, cpu=False, reveal=update.Reveal(1, 2, 7, initial_seed=54321)) as watcher:
        write_lines(tmp_path, 0, ("ready", None))
        assert wait_until(lambda: len(watcher.events.get(0, [])) == 1)
        time.sleep(0.1)
        assert not revealed.exists()  # rank 1 is not ready yet
        write_lines(tmp_path, 1, ("ready", None))
        assert wait_until(revealed.exists)
        time.sleep(0.2)
        for rank in (0, 1):
            write_lines(tmp_path, rank, ("begin", None), ("end", 1))
        assert wait_until(lambda: all(len(watcher.events.get(r, [])) == 3 for r in (0, 1)))
    assert json.loads(revealed.read_text()) == {"initial_seed": 54321}
    stamps = clock_checks.load_stamps(tmp_path)
    assert stamps["initial_reveal"]["stamp"] == stamps["ranks"]["1"][0][0]
    (tmp_path / REPORT_FILE).write_text(json.dumps({"seed": 1, "trained_seed": 54321, "tensors": {}}))
    check = reveal_checks.initial_reveal_check(stamps, tmp_path)
    assert check.status == "pass" and check.figures["first_window_seconds"] >= 0.2, check
    (tmp_path / REPORT_FILE).write_text(json.dumps({"seed": 1, "trained_seed": 1, "tensors": {}}))
    assert "the host revealed 54321" in reveal_checks.initial_reveal_check(stamps, tmp_path).detail
    (tmp_path / REPORT_FILE).write_text(json.dumps({"seed": 1, "trained_seed": 54321, "tensors": {}}))
    stamps["ranks"]["0"][1][0] = stamps["initial_reveal"]["stamp"] - 0.5  # rank 0's step began before the reveal
    early = reveal_checks.initial_reveal_check(stamps, tmp_path)
    assert early.status == "fail" and "before the host revealed" in early.detail, early


def test_the_worker_waits_for_the_reveal_and_gives_up_without_one(tmp_path):
    assert worker_update.wait_for_reveal(tmp_path, timeout=0.1) is None
    update.Reveal(after_step=1, ranks=1, seed=7, initial_seed=8).write(tmp_path)
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


def test_a_warmup_that_ends_before_any_optimizer_step_must_leave_the_weights_as_they_were(tmp_path):
    """Micro-iterations (`steps.unit: micro`) fewer than one optimizer step in the warm-up: its
    projection is 0 for every honest run, and the same 0 beside the reference's is parity."""
    stamps = {"warmup_reveal": {"seed": 5, "stamp": 1.0}}
    (tmp_path / update.WARMUP_UPDATE.file).write_text(json.dumps({"projection_seed": 5, "projection": 0.0, "norm": 0.0}))
    kept = update.check(tmp_path, stamps, of=update.WARMUP_UPDATE, still=True)
    assert kept.status == "pass" and "no optimizer step had ended" in kept.detail
    assert update.check(tmp_path, stamps, of=update.WARMUP_UPDATE).status == "fail"  # a step was due: frozen
    (tmp_path / update.WARMUP_UPDATE.file).write_text(json.dumps({"projection_seed": 5, "projection": 2e-3, "norm": 1e-2}))
    early = update.check(tmp_path, stamps, of=update.WARMUP_UPDATE, still=True)
    assert early.status == "fail" and "before any optimizer step had ended" in early.detail

    def warm(backend, projection, norm):
        return RunResult(backend=backend, scenario="s", status="ok", checks=[Check(
            name=update.WARMUP_UPDATE.name, status="pass", figures={"projection_seed": 5, "projection": projection,
                                                                    "norm": norm})])
    both = update.parity(warm("a", 0.0, 0.0), warm("torch", 0.0, 0.0), "fp32", "warmup_update_parity", update.WARMUP_UPDATE)
    assert both.status == "pass"
    moved = update.parity(warm("a", 2e-3, 1e-2), warm("torch", 0.0, 0.0), "fp32", "warmup_update_parity",
                          update.WARMUP_UPDATE)
    assert moved.status == "fail"


def result(backend, projection, norm=8.0e-02, scheme="step_token_mean", seed=5, run_dir=None):
    """An `ok` run whose update claim passed, and whose loss records (in `run_dir`) show `scheme`."""
    if run_dir is not None:
        scale = {"step_token_mean": 1.0, "micro_mean_mean": 0.5, "unknown": None}[scheme]
        records = [{"step": 1, "micro": i, "loss": 6.0, "divisor": 511 if scale == 1.0 else sup, "supervised": sup,
                    "labelled": sup, **({} if scale is None else {"scale": scale})} for i, sup in enumerate((300, 211))]
        (run_dir / "losses").mkdir(parents=True)
        (run_dir / "losses" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = {"projection_seed": seed, "projection": projection, "norm": norm}
    check = Check(name="update", status="pass", figures=figures)
    return RunResult(backend=backend, scenario="s", status="ok", checks=[check], loss_curve={1: 6.0, 2: 5.9},
                     settings={"loss_normalization": "the torch loop's words"}, run_dir=run_dir)


def test_update_parity_is_judged_on_the_update_norm_where_both_normalise_alike(tmp_path):
    """|p - p_ref| over the reference's |dw| (not over its projection,
    whose scale is luck), judged where the loss records show one normalisation; elsewhere
    `unverified` with why, never `skipped`."""
    at = iter(range(100)).__next__
    reference = result("torch", -4.964129e-03, run_dir=tmp_path / str(at()))
    good = update.parity(result("x", -4.964279e-03, run_dir=tmp_path / str(at())), reference, "fp32")
    assert good.status == "pass" and good.figures["relative"] == pytest.approx(1.5e-7 / 8.0e-02)
    far = update.parity(result("x", -4.0e-03, run_dir=tmp_path / str(at())), reference, "fp32")
    assert far.status == "fail" and "moved otherwise" in far.detail
    # A reference whose projection happens to lie near 0: the scale is its update's norm, so an
    # honest run's rounding stays small (over the projection it was 1.5e-7 / 1e-9: 150)
    near_zero = result("torch", 1e-9, run_dir=tmp_path / str(at()))
    assert update.parity(result("x", 1.0015e-9 + 1.5e-7, run_dir=tmp_path / str(at())), near_zero, "fp32").status == "pass"
    # Another normalisation, whatever its curve: not judged, and it says which reference it needs
    other = update.parity(result("x", -1.85e-02, scheme="micro_mean_mean", run_dir=tmp_path / str(at())), reference, "fp32")
    assert other.status == "unverified" and "loss_scheme micro_mean_mean" in other.detail
    assert other.figures["reference_projection"] == -4.964129e-03
    old = update.parity(result("x", -4.0e-03, scheme="unknown", run_dir=tmp_path / str(at())), reference, "fp32")
    assert old.status == "unverified" and "unknown" in old.detail
    # A reference without a norm (an older worker SDK): unverified
    no_norm = result("torch", -4.964129e-03, norm=None, run_dir=tmp_path / str(at()))
    assert update.parity(result("x", -4.0e-03, run_dir=tmp_path / str(at())), no_norm, "fp32").status == "unverified"
    # projected onto another vector (SLURM jobs draw their own seeds): no comparison applies
    assert update.parity(result("x", -4.9e-3, seed=6), reference, "fp32").status == "skipped"
    failed = reference.model_copy(update={"checks": []})
    assert update.parity(result("x", -4.9e-3), failed, "fp32") is None


def lora_claim(run_dir, base_norm, adapters_norm, seed=5):
    (run_dir / UPDATE_FILE).write_text(json.dumps({
        "projection_seed": seed, "projection": 0.3, "norm": (base_norm ** 2 + adapters_norm ** 2) ** 0.5,
        "base": {"projection": 0.1 if base_norm else 0.0, "norm": base_norm},
        "adapters": {"projection": 0.3, "norm": adapters_norm}}))


def test_with_adapters_the_base_must_stay_and_the_adapters_move(tmp_path):
    """With adapters, two figures more, both checked. A worker claiming LoRA that trained
    its base (or nothing of its adapters) fails; an older SDK's single figure is unverified."""
    stamps = {"reveal": {"seed": 5, "stamp": 1.0}}
    claimed(tmp_path, 5, -4.9e-3)
    older = update.check(tmp_path, stamps, adapters=True)
    assert older.status == "unverified" and "does not part the frozen base from the adapters" in older.detail
    lora_claim(tmp_path, 0.0, 0.02)
    ok = update.check(tmp_path, stamps, adapters=True)
    assert ok.status == "pass" and "base unchanged" in ok.detail and ok.figures["adapters_norm"] == 0.02
    # one element of the base given one AdamW step moves by about the learning rate
    lora_claim(tmp_path, LEARNING_RATE, 0.02)
    trained_base = update.check(tmp_path, stamps, adapters=True)
    assert trained_base.status == "fail" and "the frozen base moved" in trained_base.detail
    # one element one ulp off its recomputed initial value (2**-34 at |w| ~ 7e-4): an honest base
    lora_claim(tmp_path, 2.0 ** -34, 0.031)
    rounded = update.check(tmp_path, stamps, adapters=True)
    assert rounded.status == "pass" and "the rounding of a recomputed initial value" in rounded.detail
    lora_claim(tmp_path, 0.0, 0.0)
    still = update.check(tmp_path, stamps, adapters=True)
    assert still.status == "fail" and "the adapters never changed" in still.detail
    lora_claim(tmp_path, 0.0, 0.02)
    assert update.check(tmp_path, stamps).status == "pass"  # a full run's claim reads as before


def parts(backend, norm, **part_norms):
    """A run whose passed update claim reports |dw| per part of the model."""
    run = result(backend, 1e-3, norm=norm)
    run.checks[0].figures.update({f"{update.PART}{part}:norm": n for part, n in part_norms.items()})
    return run


def test_each_part_moves_as_the_references_and_rounding_is_no_move():
    """A part moved (or stayed) as the reference's did; a frozen part's rounding of its recomputed
    initial values is no move on either side, a part one step of the learning rate moved is."""
    reference = parts("torch", 0.031, adapters=0.031, **{"layer 0": 0.0})
    assert update.parts_parity(parts("x", 0.03, adapters=0.03, **{"layer 0": 2.0 ** -34}), reference).status == "pass"
    noisy_reference = parts("torch", 0.031, adapters=0.031, **{"layer 0": 2.0 ** -34})
    assert update.parts_parity(parts("x", 0.03, adapters=0.03, **{"layer 0": 0.0}), noisy_reference).status == "pass"
    trained = update.parts_parity(parts("x", 0.03, adapters=0.03, **{"layer 0": LEARNING_RATE}), reference)
    assert trained.status == "fail" and "layer 0" in trained.detail
    full = parts("torch", 0.08, embeddings=0.01, **{"layer 0": 0.05})
    frozen = update.parts_parity(parts("x", 0.08, embeddings=0.0, **{"layer 0": 0.05}), full)
    assert frozen.status == "fail" and "embeddings |dw| 0.000e+00 against 1.000e-02 (frozen)" in frozen.detail


def test_an_update_claim_without_a_norm_still_reads(tmp_path):
    stamps = {"reveal": {"seed": 5, "stamp": 1.0}}
    claimed(tmp_path, 5, -4.9e-3)
    assert update.check(tmp_path, stamps).figures["norm"] is None
    (tmp_path / UPDATE_FILE).write_text(json.dumps({"projection_seed": 5, "projection": -4.9e-3, "norm": 0.07}))
    assert update.check(tmp_path, stamps).figures["norm"] == 0.07


PROJECT = """
import json, sys, torch, transformers
from framework_bench.worker import initial_weights_worker, update
cfg = json.loads(sys.argv[1])
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
model = transformers.AutoModelForCausalLM.from_config(config)
initial_weights_worker.fill(model, 1024, config.to_dict())
untouched = update.project(model, 1024, config.to_dict(), 99)["all"]
with torch.no_grad():
    model.model.layers[1].mlp.up_proj.weight[3, :5] += torch.arange(1.0, 6.0)
    model.model.norm.weight[7] -= 0.5
moved, norm = update.project(model, 1024, config.to_dict(), 99)["all"]
print(json.dumps({"untouched": untouched, "moved": moved, "norm": norm, "up": model.model.layers[1].mlp.up_proj.weight.shape[1]}))
"""


@pytest.mark.slow  # starts a framework's or the host's own process
def test_the_torch_projection_is_the_numpy_sum_over_the_changed_elements():
    """Elements never updated add exactly 0 (the initial values are recomputed as `fill` stored
    them); the changed ones add their change times the seed's vector, as numpy computes it, and
    their squared change to the norm."""
    env = backend_env_or_skip("torch")
    cfg = scenario.load("tiny_cpu").model_config_for_run
    out = subprocess.run([str(env.python), "-c", PROJECT, json.dumps(cfg)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["untouched"] == [0.0, 0.0]
    up = "model.layers.1.mlp.up_proj.weight"
    v_up = iw.standard_normal(3 * got["up"] + np.arange(5), iw.projection_key(99, up))
    v_norm = iw.standard_normal(np.array([7]), iw.projection_key(99, "model.norm.weight"))
    # the float32 rounding of (initial + change) - initial: within 1e-7 of the change
    want = float(np.dot(np.arange(1.0, 6.0), v_up) - 0.5 * v_norm[0])
    assert got["moved"] == pytest.approx(want, rel=1e-6)
    # |final - initial| in the same pass: the changes' L2 norm
    assert got["norm"] == pytest.approx(float(np.sqrt(np.sum(np.arange(1.0, 6.0) ** 2) + 0.5 ** 2)), rel=1e-6)


PROJECT_LORA = """
import json, sys, torch, transformers, peft
from framework_bench.worker import initial_weights_worker, update
cfg = json.loads(sys.argv[1])
config = transformers.AutoConfig.for_model(cfg.pop("model_type"), **cfg)
model = peft.get_peft_model(transformers.AutoModelForCausalLM.from_config(config),
                            peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "down_proj"]))
initial_weights_worker.fill(model, 1024, config.to_dict())
layer = model.base_model.model.model.layers[1]
zero_b = float(layer.self_attn.q_proj.lora_B.default.weight.abs().sum())
untouched = update.project(model, 1024, config.to_dict(), 99)
with torch.no_grad():
    layer.self_attn.q_proj.lora_B.default.weight[2, :3] += torch.tensor([1.0, 2.0, 3.0])
after_adapter = update.project(model, 1024, config.to_dict(), 99)
with torch.no_grad():
    layer.mlp.down_proj.base_layer.weight[0, 0] += 0.25
after_base = update.project(model, 1024, config.to_dict(), 99)
print(json.dumps({"zero_b": zero_b, "untouched": untouched, "after_adapter": after_adapter, "after_base": after_base}))
"""


@pytest.mark.slow  # starts a framework's or the host's own process
def test_with_peft_adapters_the_projection_parts_base_and_adapters():
    """peft's names (`base_model.model.`, `.base_layer.`, `.lora_B.default.`) are the canonical
    ones: the fill leaves B zero, and a change shows in the part it was made in only."""
    env = backend_env_or_skip("torch")
    cfg = scenario.load("tiny_cpu").model_config_for_run
    out = subprocess.run([str(env.python), "-c", PROJECT_LORA, json.dumps(cfg)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["zero_b"] == 0.0
    layers = {f"layer {i}" for i in range(cfg["num_hidden_layers"])}
    assert {"all", "base", "adapters", "embeddings", "final norm"} | layers <= set(got["untouched"])
    assert all(figures == [0.0, 0.0] for figures in got["untouched"].values()), got["untouched"]
    b = "model.layers.1.self_attn.q_proj.lora_B.weight"
    v = iw.standard_normal(2 * 4 + np.arange(3), iw.projection_key(99, b))
    assert got["after_adapter"]["adapters"][0] == pytest.approx(float(np.dot([1.0, 2.0, 3.0], v)), rel=1e-6)
    assert got["after_adapter"]["base"] == [0.0, 0.0]
    assert got["after_base"]["base"][1] == pytest.approx(0.25, rel=1e-6)
    # each part alone: the base's change is layer 1's, the adapters' is not a layer's
    assert got["after_base"]["layer 1"][1] == pytest.approx(0.25, rel=1e-6)
    assert all(got["after_base"][p] == [0.0, 0.0] for p in layers - {"layer 1"} | {"embeddings", "final norm"})
    assert got["after_base"]["adapters"] == got["after_adapter"]["adapters"]
