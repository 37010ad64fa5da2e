"""`fbench device check`: the one-GPU check, ordered and bounded, its files rewritten after every run.

Order (the device machine is lent for 15 minutes, start-up and install included, and never twice):
`tiny_cuda` for every backend first (a backend that fails it skips its 7B runs), then
`llama2_7b_8k_1gpu`, then `llama2_7b_32k_1gpu`, each for every backend, then
`llama2_7b_8k_1gpu_zero3` only if 2 minutes remain and deepspeed imports in the env. 7B runs take
1 warm-up + 3 measured steps. Each run has a timeout; a run whose estimate could no longer finish
within the budget is stored `unsupported` ("check budget") without starting. On a machine without a GPU
(the CPU rehearsal) the plan is `tiny_cpu` for every backend. Each scenario's runs are one round
(`framework_bench/run/round.py`): every run judged against the reference's beside it, as a compare
judges it, its judging runs (loss schemes, fp32 twins) started only while JUDGING_MIN_LEFT_S remain.

`--out` holds exactly: results.sqlite, runs.json, report.html (charts inlined), logs.txt (every
run's log tail) and table.txt (TGS, % of torch, TFLOPs, MFU, peak memory, start-up, and the GPU's
SM clock and power over the run where nvidia-smi reads them; then each pair's verdict, as
`fbench compare` gives them: one run a point says "1 trial: no interval").
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from framework_bench.envs import venvs as envs
from framework_bench.measure import flops, gpus
from framework_bench.measure.memory import estimate
from framework_bench.plugins import registry as plugins
from framework_bench.scenario import scenario as scenario_mod
from framework_bench.present.verdict import Points, share_cell, tgs_cell
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import absent_reason, reference_backend
from framework_bench.run.round import LocalRuns, Round
from framework_bench.measure.metrics import RunResult
from framework_bench.scenario.scenario import PROJECT_ROOT, Scenario

OUT_FILES = ("results.sqlite", "runs.json", "report.html", "logs.txt", "table.txt")
TINY = {"cuda": "tiny_cuda", "cpu": "tiny_cpu"}
SEVEN_B = ("llama2_7b_8k_1gpu", "llama2_7b_32k_1gpu")
ZERO3 = "llama2_7b_8k_1gpu_zero3"
ZERO3_MIN_LEFT_S = 120
JUDGING_MIN_LEFT_S = 30  # a judging run (the reference's loss scheme, an fp32 twin) starts only with this left
SEVEN_B_STEPS = {"warmup": 1, "measured": 3}
LOG_TAIL_LINES = 60

# The estimate (`--dry`). Steps: the published XTuner figure of the same context on A100
# (scenarios/llama2_7b_<ctx>.yaml, per GPU, batch 1 as here) scaled to the GPU estimated for
# (`fbench device estimate --gpu`, the H200 by default: the check's machine) by the ratio of dense
# bf16 peaks (H200: 989/312), then x1.5 for safety: 1.27 s at 8k, 5.5 s at 32k on the H200 (a
# plain PyTorch loop measured 1.17 s and 6.04 s on one H200: shared/notes/backend-facts.md).
# ZeRO-3 on one GPU adds its gathers and offload-free partitioning overhead: x1.5 again.
PUBLISHED = {"llama2_7b_8k_1gpu": "llama2_7b_8k", "llama2_7b_32k_1gpu": "llama2_7b_32k",
             ZERO3: "llama2_7b_8k"}
CHECK_GPU = "H200"
STEP_SAFETY = 1.5
ZERO3_FACTOR = 1.5
TINY_STEP_S = 0.1
# Start-up: each backend's tiny_cpu run in the CPU rehearsal, wall time (worker start-up, 7 tiny
# steps, exit: an upper bound of its start-up; the torch worker reports no start-up of its own),
# measured on this project's loaded 2-core machine (benchmarks/device/rehearsal-startup.json),
# times STARTUP_FACTOR: 1, as the GPU machine's 16 cores import no slower. For 7B, plus
# MODEL_7B_BUILD_S to build a random-init 7B and move it to the GPU: the upper end of the 25-45 s
# a 7B start-up was expected to take there, less the ~10 s the rehearsal already counts. Plus the
# host's own per-run work (packing, launch, storing, CUDA's initialisation): RUN_OVERHEAD_S.
STARTUP_FILE = PROJECT_ROOT / "benchmarks" / "device" / "rehearsal-startup.json"
STARTUP_FACTOR = 1.0
MODEL_7B_BUILD_S = 35.0
RUN_OVERHEAD_S = 5.0


class Planned(BaseModel):
    backend: str
    scenario: str
    estimate_s: float


def load_scenario(name: str) -> Scenario:
    s = scenario_mod.load(name)
    if name in SEVEN_B or name == ZERO3:
        s = s.model_copy(update={"steps": s.steps.model_copy(update=SEVEN_B_STEPS)})
    return s


def rehearsal_startups() -> dict[str, float]:
    return json.loads(STARTUP_FILE.read_text())["tiny_cpu_wall_seconds"]


def peak_ratio(gpu: str, published: Scenario) -> float:
    """How much faster `gpu` (a `gpus.MODELS` name) steps than the GPU a published figure was
    measured on, by their dense bf16 peaks."""
    return gpus.MODELS[gpu].peak_tflops / flops.gpu_peak_tflops(published.reference.hardware)


def estimate_s(backend: str, s: Scenario, startups: dict[str, float], gpu: str = CHECK_GPU) -> float:
    # a backend the rehearsal did not time (one named with --backends) is given the slowest start-up timed
    startup = startups.get(backend, max(startups.values())) * STARTUP_FACTOR + RUN_OVERHEAD_S
    if s.name in PUBLISHED:
        published = scenario_mod.load(PUBLISHED[s.name])
        step = s.tokens_per_gpu_step / (published.reference.tgs * peak_ratio(gpu, published)) * STEP_SAFETY
        step *= ZERO3_FACTOR if s.name == ZERO3 else 1.0
        return startup + MODEL_7B_BUILD_S + s.steps.total * step
    return startup + s.steps.total * TINY_STEP_S


def installed_backends() -> tuple[str, ...]:
    """What the check runs unless told: every installed backend the CPU rehearsal timed (its
    start-up is the estimate's input; a backend joins once rehearsed, with its wheels in the
    bundle's lists), the reference first."""
    found, rehearsed = plugins.backends(), rehearsal_startups()
    return tuple(sorted((b for b in found if b in rehearsed), key=lambda b: (not found[b].info.reference, b)))


def plan(device: str, backends: tuple[str, ...] | None = None, gpu: str = CHECK_GPU) -> list[Planned]:
    """Every run the check may start, in order (ZeRO-3 last, conditional), its time estimated on
    `gpu`. A run outside its backend's declared capabilities (the torch reference has no ZeRO)
    costs nothing: it is stored `unsupported` at once."""
    startups = rehearsal_startups()
    names = [TINY[device]] + (list(SEVEN_B) + [ZERO3] if device == "cuda" else [])
    planned = []
    backends = backends or installed_backends()
    for n in names:
        s = load_scenario(n)
        for b in backends:
            refused = plugins.get(b).refusal(s) is not None
            planned.append(Planned(backend=b, scenario=n,
                                   estimate_s=0.0 if refused else round(estimate_s(b, s, startups, gpu), 1)))
    return planned


def dry_lines(budget_s: float, gpu: str = CHECK_GPU) -> list[str]:
    """The estimate on one `gpu`, run by run: which its memory refuses (at once, for nothing) and
    which could not finish within the budget."""
    lines, used, every = [], 0.0, 0.0
    planned = plan("cuda", gpu=gpu)
    for p in planned:
        memory = memory_refusal(p, gpu) if p.estimate_s else None
        cost = 0.0 if memory else p.estimate_s
        finishes = used + cost <= budget_s and (p.scenario != ZERO3 or budget_s - used >= ZERO3_MIN_LEFT_S)
        used += cost if finishes else 0.0
        every += cost
        lines.append(f"{p.scenario:28} {p.backend:13} {cost:6.1f} s  "
                     + ("(refused by its capabilities)" if not p.estimate_s else
                        f"(refused: memory {memory})" if memory else
                        "" if finishes else "(would not finish within the budget: stored unsupported, check budget)"))
    lines.append(f"every run above: {every / 60:.1f} minutes; the budget refuses what could no longer finish within "
                 "it when its turn comes (runs faster than estimated leave room for more)")
    ratios = "/".join(dict.fromkeys(f"x{peak_ratio(gpu, scenario_mod.load(n)):.2f}" for n in PUBLISHED.values()))
    lines.append(f"estimated on one {gpu}: {used / 60:.1f} minutes of runs inside the {budget_s / 60:.1f}-minute budget "
                 f"(steps: published A100 figures {ratios} peak ratio x{STEP_SAFETY} safety; start-up: "
                 f"the CPU rehearsal's tiny_cpu wall time x{STARTUP_FACTOR:g} + {MODEL_7B_BUILD_S:.0f} s to build a 7B + "
                 f"{RUN_OVERHEAD_S:.0f} s per run)")
    return lines


def memory_refusal(p: Planned, gpu: str) -> str | None:
    """'does not fit on A100-40G (40 GiB) by 75.6 GiB' where the backend's memory estimate of the
    run refuses it on `gpu` (the check's own run would be stored `unsupported` at once); None where it fits."""
    e = estimate(load_scenario(p.scenario), declared=plugins.get(p.backend).info.memory, gpu=gpu)
    return None if e.fits else e.fit_line(gpu)


class GpuSampler:
    """The GPU's SM clock (MHz) and power (W), sampled by nvidia-smi twice a second, where readable."""

    def __init__(self):
        self.samples: list[tuple[float, float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                          "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                sm, power = (float(x) for x in line.split(","))
            except ValueError:  # "[N/A]" where the GPU does not report one
                continue
            self.samples.append((time.time(), sm, power))

    def mean(self, start: float, end: float) -> tuple[float | None, float | None]:
        window = [(sm, w) for t, sm, w in list(self.samples) if start <= t <= end]
        if not window:
            return None, None
        return statistics.mean(s for s, _ in window), statistics.mean(w for _, w in window)

    def stop(self) -> None:
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def _deepspeed_imports(backend: str) -> bool:
    record = envs.env_path(backend) / envs.RECORD
    smoke = json.loads(record.read_text()).get("smoke_test") or {} if record.exists() else {}
    version = str(smoke.get("deepspeed", "absent"))
    return version != "absent" and not version.startswith("import fails")


def _fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def _gib(n: int | None) -> str:
    return "-" if not n else f"{n / 2**30:.2f}"


def _log_tail(r: RunResult) -> str:
    log = r.run_dir / "worker.log" if r.run_dir else None
    if log and log.exists():
        return "".join(log.read_text(errors="replace").splitlines(keepends=True)[-LOG_TAIL_LINES:])
    return (r.reason or "(no log: the run did not start)") + "\n"


class BudgetedRuns(LocalRuns):
    """The runs that judge another (the reference trained as a run says it trained, a twin), started
    only while `left_s()` holds JUDGING_MIN_LEFT_S of the check's budget, never stored."""

    def __init__(self, options: RunOptions, left_s: Callable[[], float]):
        super().__init__(options)
        self.left_s = left_s

    def __call__(self, backend: str, trained: Scenario, scheme: str | None, settings_mode: str | None = None) -> RunResult:
        if (left := self.left_s()) < JUDGING_MIN_LEFT_S:
            return RunResult(backend=backend, scenario=trained.name, status="unsupported",
                             reason=f"check budget: {max(left, 0):.0f} s left, too little for a judging run")
        return super().__call__(backend, trained, scheme, settings_mode)


class Check:
    def __init__(self, out: Path, device: str, budget_s: float, backends: tuple[str, ...],
                 say: Callable[[str], None]):
        from framework_bench.store.results import ResultStore
        self.out, self.device, self.budget_s, self.backends, self.say = out, device, budget_s, backends, say
        out.mkdir(parents=True, exist_ok=True)
        for name in OUT_FILES:
            (out / name).unlink(missing_ok=True)
        self.store = ResultStore(out / "results.sqlite")
        self.rows: list[tuple[RunResult, Scenario, float, tuple[float | None, float | None]]] = []
        self.measured: dict[int, tuple[float, tuple[float | None, float | None]]] = {}  # by id(result), until stored
        self.started = time.monotonic()
        self.sampler = GpuSampler()

    def left_s(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def record(self, r: RunResult, s: Scenario) -> None:
        """A run once judged and stored by its round (its wall time and GPU samples were taken as it ran)."""
        self.rows.append((r, s, *self.measured.pop(id(r), (0.0, (None, None)))))
        self.write()
        self.say(f"{r.scenario} {r.backend}: {r.status}" + (f" TGS {r.tgs:,.1f}" if r.tgs else "")
                 + (f" ({r.reason.splitlines()[0]})" if r.reason and r.status != "ok" else ""))

    def run(self, p: Planned, round_: Round) -> RunResult:
        s = round_.scenario
        left = self.left_s()
        if p.estimate_s > left:
            return round_.add(p.backend, RunResult(
                backend=p.backend, scenario=s.name, status="unsupported",
                reason=f"check budget: estimated {p.estimate_s:.0f} s, {max(left, 0):.0f} s of the budget left"))
        # The run's own limit: twice its estimate, never past the budget. The estimates are an
        # H200's: the CPU rehearsal's runs are bounded by the budget alone.
        timeout = max(1.0, min(2 * p.estimate_s, left) if self.device == "cuda" else left)
        self.say(f"{s.name} {p.backend}: starting (estimate {p.estimate_s:.0f} s, timeout {timeout:.0f} s)")
        t0, w0 = time.monotonic(), time.time()
        try:
            r = round_.run(p.backend, timeout=timeout)
        except Exception as e:  # one broken run must not end a check that is never rerun
            r = round_.add(p.backend, RunResult(backend=p.backend, scenario=s.name, status="failed",
                                                reason=f"{type(e).__name__}: {e}"))
        self.measured[id(r)] = (time.monotonic() - t0, self.sampler.mean(w0, time.time()))
        return r

    def execute(self) -> list[RunResult]:
        failed_tiny: dict[str, str] = {}
        try:
            planned = plan(self.device, self.backends)
            for name in dict.fromkeys(p.scenario for p in planned):
                mine = [p for p in planned if p.scenario == name]
                s = load_scenario(name)
                options = RunOptions(timeout=self.left_s())
                round_ = Round(s, options, reference=reference_backend(), order=[p.backend for p in mine],
                               store=self.store, judging=BudgetedRuns(options, self.left_s), absent=absent_reason(),
                               on_result=self.record)
                for p in mine:
                    why = None
                    if p.backend in failed_tiny and name != TINY[self.device]:
                        why = f"skipped: its {TINY[self.device]} run was {failed_tiny[p.backend]}"
                    elif name == ZERO3 and not _deepspeed_imports(p.backend):
                        why = "skipped: deepspeed does not import in the env (see its smoke test)"
                    elif name == ZERO3 and self.left_s() < ZERO3_MIN_LEFT_S:
                        why = f"check budget: ZeRO-3 runs only with {ZERO3_MIN_LEFT_S} s left"
                    if why:
                        round_.add(p.backend, RunResult(backend=p.backend, scenario=s.name, status="unsupported",
                                                        reason=why))
                        continue
                    r = self.run(p, round_)
                    if name == TINY[self.device] and r.status != "ok":
                        failed_tiny[p.backend] = r.status
                round_.close()
        finally:
            self.sampler.stop()
            self.store.close()
        return [r for r, *_ in self.rows]

    def write(self) -> None:
        """Rewrite every file of --out from what has run so far."""
        from framework_bench.store.export import export
        (self.out / "runs.json").write_text(export(self.store, "json"))
        (self.out / "logs.txt").write_text("".join(
            f"===== {r.scenario} / {r.backend}: {r.status} (run folder {r.run_dir or '-'})\n{_log_tail(r)}\n"
            for r, *_ in self.rows))
        (self.out / "table.txt").write_text(self.table())
        rows = self.store.latest_by_point()
        if rows:
            from framework_bench.present.plotting import plot_results
            from framework_bench.present.report import write_report
            with tempfile.TemporaryDirectory() as tmp:  # charts and report.md stay out of --out
                charts = plot_results(rows, Path(tmp))
                _, page = write_report(rows, Path(tmp), [c for c in charts if c.suffix == ".png"])
                shutil.copy2(page, self.out / "report.html")

    def table(self) -> str:
        # TGS and % of the reference as the compare table gives them (present/verdict.py): the
        # median and its 95% interval from two trials of a point, each run's own scenario definition
        # (the 7B runs' shortened steps) keeping it apart from the stored scenario of that name.
        points = Points([{**r.model_dump(mode="json"), "scenario_json": s.model_dump(mode="json")}
                         for r, s, *_ in self.rows], reference_backend())
        header = ("scenario", "backend", "status", "TGS", f"% {reference_backend() or 'reference'}", "TFLOPs", "MFU%", "alloc GiB",
                  "reserved GiB", "start-up s", "wall s", "SM MHz", "power W", "version")
        lines = [header]
        for r, s, wall, (sm, power) in self.rows:
            summary = points.summaries.get((r.scenario, r.backend))
            tgs = tgs_cell(summary) if summary and summary.trials else _fmt(r.tgs)  # none counts: the run's own figure
            lines.append((r.scenario, r.backend, r.status, tgs, share_cell(points.shares.get((r.scenario, r.backend))),
                          _fmt(r.tflops, ".1f"),
                          _fmt(r.mfu * 100 if r.mfu is not None else None, ".1f"), _gib(r.peak_mem_bytes),
                          _gib(r.peak_reserved_bytes), _fmt(r.startup_seconds), _fmt(wall or None),
                          _fmt(sm, ".0f"), _fmt(power, ".0f"), r.framework_version or "-"))
        widths = [max(len(str(row[i])) for row in lines) for i in range(len(header))]
        text = "".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in lines)
        steps = ", ".join(f"{k} {v}" for k, v in SEVEN_B_STEPS.items())
        text += f"\n7B runs: {steps} steps. Budget {self.budget_s:.0f} s; used {time.monotonic() - self.started:.0f} s.\n"
        for backend in self.backends:
            env = envs.inspect(backend)
            own = plugins.get(backend).info.env.framework_package
            text += (f"{backend} env: flavour {env.flavour or '-'}; " + ", ".join(
                f"{k} {env.version(k) or '-'}" for k in dict.fromkeys(("torch", "transformers", own, "deepspeed",
                                                                       "flash-attn"))) + "\n")
        for r, *_ in self.rows:
            if r.status != "ok" and r.reason:
                text += f"{r.scenario} {r.backend}: {r.reason.splitlines()[0][:300]}\n"
        text += "".join(f"{line}\n" for line in points.lines)
        return text


def check(out: Path, budget_s: float, device: str, backends: tuple[str, ...] | None = None,
          say: Callable[[str], None] = lambda m: None) -> list[RunResult]:
    backends = backends or installed_backends()
    unknown = set(backends) - set(plugins.backends())
    if unknown:
        raise ValueError(f"no backend named {', '.join(sorted(unknown))}")
    return Check(out, device, budget_s, backends, say).execute()
