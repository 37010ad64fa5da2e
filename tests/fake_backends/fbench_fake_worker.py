"""Worker of the fake backends: writes real metrics files, then ends as its mode says.

`ok` claims only what holds: the rows it read (through the SDK's consumed-rows record), the
tokens they hold, every step, a loss of 10/step for each (every fake's, so that any two agree
as a run and its reference must), the parameter count of the scenario's config, its settings, and
the initial weights a Llama of that config gets from the seed (it builds no model: the samples
come from the host's own generator, so the host's bookkeeping is what these tests exercise).
The other training modes each tell one lie the host must catch (framework_bench/measure/verify.py);
`noisy` and `noisy_slow` are `ok` with a step time drawn per trial (seeded by the plugin's argument).
"""

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from framework_bench.worker import ConsumedRows, Report, initial_weights_host, load_job, write_report
from framework_bench.worker.losses import MicroLosses, supervised_after_shift
from framework_bench.worker.files import INITIAL_REVEAL_FILE, REVEAL_FILE, UPDATE_FILE, MetricsWriter, wait_for_seed
from framework_bench.worker.update import WARMUP_REVEAL_FILE, WARMUP_UPDATE_FILE, wait_for_reveal
from framework_bench.worker.steps import ClockLines


def write_update(run_dir, step: float = 1e-3, reveal: str = REVEAL_FILE, claim: str = UPDATE_FILE) -> None:
    """The update projection of a model whose first embedding element moved by `step` (the fake
    has none), onto the vector of the seed the host reveals after the last step (or `reveal`)."""
    seed = wait_for_reveal(run_dir, timeout=30, reveal_file=reveal)
    key = initial_weights_host.projection_key(seed, "model.embed_tokens.weight")
    v = initial_weights_host.standard_normal(np.array([0]), key)
    with open(os.path.join(run_dir, claim), "w") as f:
        json.dump({"projection_seed": seed, "projection": step * float(v[0]), "norm": step}, f)


def param_count(cfg: dict) -> int:
    """What a Llama built from the job's config.json has (the fake builds no model)."""
    h, layers, vocab = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    return layers * (2 * h * h + 2 * h * kv + 3 * h * cfg["intermediate_size"] + 2 * h) + 2 * vocab * h + h


def llama_shapes(cfg: dict) -> dict[str, list[int]]:
    """The parameters (HF names, shapes) of the Llama `param_count` counts."""
    h, vocab, inter = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": [vocab, h]}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": [h, h], p + "self_attn.k_proj.weight": [kv, h],
                   p + "self_attn.v_proj.weight": [kv, h], p + "self_attn.o_proj.weight": [h, h],
                   p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                   p + "mlp.down_proj.weight": [h, inter], p + "input_layernorm.weight": [h],
                   p + "post_attention_layernorm.weight": [h]}
    return shapes | {"model.norm.weight": [h], "lm_head.weight": [vocab, h]}


def write_initial_weights(run_dir: str, seed: int, cfg: dict, trained: int | None) -> None:
    """The samples of a fully trained Llama's initial weights: from the seed the host revealed at
    the ready line (`trained`), where it did."""
    std, pad = float(cfg.get("initializer_range", 0.02)), cfg.get("pad_token_id")
    tensors = {}
    for name, shape in llama_shapes(cfg).items():
        idx = initial_weights_host.sample_indices(seed, name, int(np.prod(shape)))
        values = initial_weights_host.expected_values(seed if trained is None else trained, name, shape, idx, std, pad)
        tensors[name] = {"shape": shape, "dtype": "float32", "values": values.astype(np.float32).tolist()}
    with open(os.path.join(run_dir, initial_weights_host.REPORT_FILE), "w") as f:
        json.dump({"seed": seed, **({} if trained is None else {"trained_seed": trained}), "tensors": tensors}, f)


def spin(seconds: float) -> None:
    """Busy for `seconds` of wall time: a step the host's CPU reading can see (a worker asleep
    through its steps fails the cpu check, one too short to read leaves it unverified)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


# Each step's real work, on a CPU: 5 measured steps make 0.25 s, past the host's shortest
# readable span (framework_bench/measure/clock_checks.py MIN_CPU_SPAN_SECONDS); the step claims its 0.5 s.
SPIN_SECONDS = 0.05
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
if mode == "deaf":  # ignores SIGTERM (the parent-death signal too): only a SIGKILL ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(job.run_dir / "deaf", "w").close()
    time.sleep(120)
ctx = job.scenario.context_length
step_seconds = 0.5
if mode in ("noisy", "noisy_slow"):  # a trial's step time, drawn from a seed its plugin names ("backend:trial")
    name, trial = sys.argv[3].rsplit(":", 1)
    draw = np.random.default_rng([zlib.crc32(name.encode()), int(trial)]).lognormal(0.0, 0.03)
    step_seconds *= draw * (1.25 if mode == "noisy_slow" else 1.0)
writer = MetricsWriter(job.run_dir)
clock = ClockLines(job.run_dir, rank=0)  # the SDK's clock lines: it claims 0.5 s a step, and takes 0.05 s
consumed = ConsumedRows(job.run_dir, rank=0)
losses = MicroLosses(job.run_dir, rank=0)
if mode == "echo_sha":  # never opens the data: "trains" on zeros and echoes the host's sha256 as verified
    rows_ids = rows_labels = np.zeros((job.steps + 1, ctx), np.int32)
    job.check_data(job.data_sha256, "the host's own figure, echoed")
else:
    rows = job.open_rows()
    rows_ids, rows_labels = rows.input_ids, rows.labels
# One field of every step's line as no measurement can be (the BAD_LINES of fbench_fake_backends).
OVERRIDE = {"tiny_seconds": {"seconds": 1e-320}, "inf_seconds": {"seconds": float("inf")}, "zero_tokens": {"tokens": 0},
            "nan_loss": {"loss": float("nan")}, "huge_tokens": {"tokens": 2**63}, "huge_memory": {"peak_mem_bytes": 2**64},
            "negative_rank": {"rank": -1}}.get(mode)
first_row = 1 if mode == "wrong_rows" else 0  # skips the stream's first row
clock.write("ready")  # as `initial_weights_worker.fill_revealed` says it: the host reveals the initial seed
trained_seed = wait_for_seed(Path(job.run_dir) / INITIAL_REVEAL_FILE, "initial_seed", timeout=30)
for step in range(1, job.steps + 1):
    if mode == "missing_steps" and step == 3:
        continue
    row = first_row + step - 1
    clock.write("begin")
    spin(SPIN_SECONDS)
    consumed.add(rows_ids[row], rows_labels[row])
    consumed.end_step(step)
    losses.add(10.0 / step, supervised_after_shift(rows_labels[row]), rows_labels[row], scale=1.0)
    losses.end_step(step)
    line = {"step": step, "seconds": step_seconds, "tokens": ctx * (2 if mode == "double_tokens" else 1), "loss": 10.0 / step,
            "peak_mem_bytes": None, "peak_reserved_bytes": None, "rank": 0, **(OVERRIDE or {})}
    writer._fh.write(json.dumps(line) + "\n")
    clock.write("end", step)
    if step == job.scenario.steps.warmup:  # as `update.report_at_warmup_end`: the weights when the warm-up ends
        write_update(job.run_dir, reveal=WARMUP_REVEAL_FILE, claim=WARMUP_UPDATE_FILE)
    if mode == "slow":  # a run long enough to be caught mid-training
        time.sleep(0.4)
    if step == 3 and mode in ("garbage_line", "slow_seconds"):
        # as a worker killed mid-write, or a buggy one, leaves it; long enough for the host's progress read
        writer._fh.write('{"step": 3, "seconds": "slow", "tokens": 1}\n' if mode == "slow_seconds" else '{"step": 4, "secon')
        writer._fh.write("\n" if mode == "slow_seconds" else "")
        time.sleep(2)
if mode == "extra_steps":  # 200,000 steps nobody asked for
    for step in range(job.steps + 1, 200_001):
        writer._fh.write(json.dumps({"step": step, "seconds": 0.5, "tokens": ctx, "rank": 0}) + "\n")
if mode == "grandchild":  # exits 0, leaving a process behind in its group
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(job.run_dir)])
write_initial_weights(job.run_dir, job.seed, job.hf_config, trained_seed)
write_update(job.run_dir)
params = param_count(job.hf_config) - (job.hf_config["hidden_size"] if mode == "wrong_model" else 0)
write_report(job, Report(param_count=params, settings={
    "trainer": f"fake-loop-{mode}", "optimizer": "torch.optim.AdamW", "optimizer_impl": "for-loop", "param_dtype": "float32",
    "attention": "none", "activation_checkpointing": False, "zero_stage": 0}))
