"""`fbench compare`: every chosen backend on every chosen scenario, on one packed stream each.

Runs are sequential (they would compete for the same devices). Each finished run is
stored at once, so Ctrl-C or a crash loses only the run in flight.
"""

from __future__ import annotations

import fnmatch
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.measure import losses, statistics, update
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.statistics import Trial
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import Machine
from framework_bench.run import pipeline, readback, verdicts
from framework_bench.run.dry_run import DryRun, dry_run
from framework_bench.run.launchers.slurm import _duration, estimate_time  # the SLURM plan's wording of a time
from framework_bench.run.options import RunOptions
from framework_bench.run.submit import Planned, submit as submit_one  # `submit` here is the loop over them
from framework_bench.spec import scenario as scenarios_
from framework_bench.spec.scenario import Scenario, ScenarioError

SETTINGS_MODES = ("matched", "native")
# Settings every backend records that change a step's time (marked where backends differ);
# each backend adds the keys only its engine records (`BackendInfo.speed_settings`: speed_relevant).
# The rest (seed, learning rate, library versions...) are shown but do not move TGS.
COMMON_SPEED_SETTINGS = frozenset({
    "trainer", "optimizer", "optimizer_impl", "grad_clip", "param_dtype", "autocast_dtype", "loss_scaler",
    "grad_reduce_dtype", "master_weights", "attention", "attention_kv_repeat", "activation_checkpointing",
    "checkpointing_reentrant", "zero_stage", "flash_attn_version", "sequence_parallel", "compile",
    "ddp_find_unused_parameters", "token_count_sync", "torch_version",
    # the fine-tuning method (framework_bench/worker/adapters.py): what trains, and in which dtypes
    "finetune_method", "trainable_params", "lora_targets", "lora_head_adapted", "lora_rank", "lora_dropout",
    "lora_dora", "lora_bias", "base_dtype", "adapter_dtype", "base_frozen", "quant_type", "double_quant",
    "compute_dtype", "quant_storage",
})
# What matched mode cannot align because it lives inside the frameworks' own code (fairness
# audit rows), whatever the frameworks; each backend adds its own (`BackendInfo.report_notes`).
# Named in the report beside the recorded settings.
NOT_ALIGNED = (
    "Each framework's transformers pin decides whether SDPA repeats grouped K/V heads "
    "(attention_kv_repeat) and the default checkpointing variant.",
    "Rows are fed in the host's order on both sides (no shuffling): the host checks each step's rows.",
)


def speed_relevant() -> frozenset[str]:
    """The settings keys that can move TGS: the common ones and each installed backend's own."""
    return COMMON_SPEED_SETTINGS.union(*(b.info.speed_settings for b in plugins.backends().values()))


def setting_differences(records: list[dict]) -> dict[str, list[tuple[str, dict[str, object], bool]]]:
    """Per scenario, each setting whose value differs between backends: (key, {backend: value},
    speed-relevant). `records` are run records (RunResult dumps or store rows) with `settings`."""
    by_scenario: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.get("settings"):
            by_scenario.setdefault(r["scenario"], {})[r["backend"]] = r["settings"]
    out: dict[str, list[tuple[str, dict[str, object], bool]]] = {}
    speed = speed_relevant()
    for name, per_backend in by_scenario.items():
        if len(per_backend) < 2:
            continue
        # a key one backend does not record is unknown there, not a difference
        keys = sorted(set.intersection(*(set(s) for s in per_backend.values())) - {"settings_mode"})
        diffs = []
        for key in keys:
            values = {b: s.get(key) for b, s in sorted(per_backend.items())}
            if len({repr(v) for v in values.values()}) > 1:
                diffs.append((key, values, key in speed))
        out[name] = sorted(diffs, key=lambda d: (not d[2], d[0]))
    return out


def expand(patterns: list[str]) -> list[Scenario]:
    """Scenario names, globs over the names in scenarios/ (`tiny_cpu*`), or file paths; in order, no
    repeats. Two different files with one name are refused: their runs would share one name."""
    names = [p.stem for p in scenarios_.scenario_paths()]
    chosen: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            hits = fnmatch.filter(names, pattern)
            if not hits:
                raise ScenarioError(f"no scenario matches {pattern!r}")
            chosen += hits
        else:
            chosen.append(pattern)
    seen: dict[str, tuple[Path, Scenario]] = {}
    for name in chosen:
        path = scenarios_.source_path(name)
        s = scenarios_.load(name)
        if s.name in seen and seen[s.name][0] != path:
            raise ScenarioError(f"two scenarios named {s.name!r}: {seen[s.name][0]} and {path}; rename one")
        seen.setdefault(s.name, (path, s))
    return sorted((s for _, s in seen.values()), key=lambda s: (s.model.preset or "", s.context_length))


# Pins the reference to another installed backend (a new reference loop, or a stand-in in tests):
# the one whose runs judge every other's, named wherever its share is shown.
REFERENCE_ENV = "FBENCH_REFERENCE"


def reference_backend() -> str | None:
    """The backend every other is judged against and shown as a share of: the one `FBENCH_REFERENCE`
    names (when installed), else the installed backend that declares itself the no-framework
    reference (`BackendInfo.reference`; two such are refused, `plugins.backends`)."""
    found = plugins.backends()
    pinned = os.environ.get(REFERENCE_ENV)
    if pinned:
        return pinned if pinned in found else None
    return next((name for name, b in found.items() if b.info.reference), None)


def definition(scenario_json: dict) -> str:
    """A scenario's stored definition as one comparable string."""
    return json.dumps(scenario_json, sort_keys=True)


class Interrupted(Exception):
    """Ctrl-C during a compare: the results finished so far are kept."""


def _reference_first(backend_names: list[str]) -> tuple[list[str], str | None]:
    """The backends in the order a SLURM compare submits them, and the reference's name: the
    reference first, so that every other run records the reference's run folder."""
    reference_name = reference_backend()
    return sorted(backend_names, key=lambda b: b != reference_name), reference_name


def trial_orders(backend_names: list[str], reference_name: str | None) -> list[list[str]]:
    """The orders of successive rounds: a Williams design over the other backends
    (`round_orders`), the reference last in each (when there is one), so that no run of a round
    can read the reference's files of that round: its loss curve and update projection are
    written after every run it judges has ended (issue 28, 3b)."""
    others = [b for b in dict.fromkeys(backend_names) if b != reference_name]
    orders = round_orders(others) or [[]]
    return [order + [reference_name] for order in orders] if reference_name else orders


def round_orders(backends: list[str]) -> list[list[str]]:
    """The orders of successive rounds, cycled: a Williams design (a Latin square balanced for
    what runs just before), so that over its rows each backend runs in each place equally often
    and right after each other backend once; an odd count needs the mirrored rows too. Its first
    row is `backends` first, then alternately from the end: 0, 1, k-1, 2, k-2, ..."""
    k = len(backends)
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    rows = [[(i + r) % k for i in first] for r in range(k)]
    if k % 2 and k > 1:
        rows += [row[::-1] for row in rows]
    return [[backends[i] for i in row] for row in rows]


def warmup_default(repeat: int, scenario: Scenario) -> int:
    """One warm-up round when a CPU scenario is repeated: the first runs after start-up pay for
    cold caches (+41-45% for whichever ran first, issue 26); it costs one more run per backend."""
    return 1 if repeat >= 2 and scenario.cluster.device == "cpu" else 0


# `--repeat auto`: rounds until every pair's interval is narrow enough. It judges only from
# AUTO_MIN_ROUNDS on (measure/statistics.py's calibration: with fewer trials a side the
# bootstrap's intervals are too narrow, so an early stop would trust the luckiest rounds), and
# stops at AUTO_MAX_ROUNDS whatever the width (a noisy machine would otherwise never end).
AUTO_MIN_ROUNDS = 5
AUTO_MAX_ROUNDS = 10


class AutoStop(BaseModel):
    """Why `--repeat auto` stopped adding rounds on one scenario."""
    scenario: str
    rounds: int = Field(description="counted rounds run (warm-up rounds not included)")
    precision: float = Field(description="the half-width asked for, in percent")
    widest: float | None = Field(description="the widest interval's half-width then, in percent (inf: one had "
                                             "no interval; None: no trial counted)")

    @property
    def capped(self) -> bool:
        """Stopped by AUTO_MAX_ROUNDS, not by the precision (nor by having nothing to narrow)."""
        return self.widest is not None and self.widest > self.precision


def compare(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions | None = None,
    *,
    repeat: int | Literal["auto"] = 1,
    warmup_rounds: int | None = None,
    precision: float | None = None,
    no_reference: bool = False,
    on_result: Callable[[RunResult, Scenario], None] = lambda r, s: None,
    on_start: Callable[[str, Scenario], None] = lambda b, s: None,
    on_step: readback.StepCallback = lambda done, total, secs: None,
    on_auto: Callable[[AutoStop], None] = lambda stop: None,
) -> list[RunResult]:
    """Every backend on every scenario, `repeat` rounds (after `warmup_rounds`, by default
    `warmup_default`): each trial a full run with every check, tagged with the compare's id, its
    round (warm-up rounds are 0 and below: stored, never counted) and its place in the round.

    No verdict without a reference (issue 28): the reference backend runs in every round, added
    when not chosen, last (`trial_orders`), and each other run of the round is judged against it
    once it ended (`pipeline.judge`); `no_reference` leaves them `unverified`. A run is handed to
    `on_result` (which stores it) once judged: the reference's first, then the round's others.
    Interrupted before the reference's run ended, the round's runs are handed on `unverified`.

    `repeat="auto"`: from AUTO_MIN_ROUNDS rounds on, stop once every pair's 95% interval is within
    ±`precision` percent (`statistics.widest_half_width`), or at AUTO_MAX_ROUNDS, said through
    `on_auto`. `fbench run` is this loop with one backend."""
    found = plugins.backends()
    missing = [b for b in backend_names if b not in found]
    broken = [f"the backend {b!r} is installed but broken: {plugins.load_errors[b]}" for b in missing
              if b in plugins.load_errors]
    if broken:
        raise plugins.UnknownBackend("\n".join(broken))
    if missing:
        raise plugins.UnknownBackend(f"no backend named {', '.join(missing)}; installed: {', '.join(found)}")
    if (repeat == "auto") != (precision is not None):
        raise ValueError("repeat='auto' goes with a precision, and a precision with repeat='auto'")
    first, last = (AUTO_MIN_ROUNDS, AUTO_MAX_ROUNDS) if repeat == "auto" else (repeat, repeat)
    results: list[RunResult] = []
    reference_name = None if no_reference else reference_backend()
    absent = ("--no-reference" if no_reference else
              f"no reference backend is installed ({REFERENCE_ENV} or BackendInfo.reference)")
    orders = trial_orders(backend_names, reference_name)
    compare_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    pending: list[tuple[RunResult, Scenario]] = []  # the round's runs waiting for its reference's

    judging: dict[tuple[int, str], RunResult] = {}  # (the round's reference, scheme): its run trained that way

    def hand_on(result: RunResult, s: Scenario, reference: RunResult | None, round_options: RunOptions,
                why: str = absent) -> None:
        if result.backend != reference_name:
            pipeline.judge(result, _judging_reference(result, reference, s, round_options, judging), s, why)
        on_result(result, s)

    try:
        for s in scenarios:
            warm = warmup_default(first, s) if warmup_rounds is None else warmup_rounds
            trials: list[RunResult] = []  # this scenario's, for the auto stop
            for i, round_ in enumerate(range(1 - warm, last + 1)):
                # A projection vector of the round's own: a run cannot pass with an earlier round's
                # reference projection, read from its folder (framework_bench/measure/update.py).
                round_options = (options or RunOptions()).model_copy(update={"projection_round": update.new_round()})
                for position, name in enumerate(orders[i % len(orders)], 1):
                    on_start(name, s)
                    # run_one packs only when the backend can run the scenario; the packed data is
                    # cached by its inputs, so every trial reads the very same files.
                    result = pipeline.run_one(name, s, round_options, on_step=on_step)
                    result.compare_id, result.trial_round, result.trial_position = compare_id, round_, position
                    results.append(result)
                    trials.append(result)
                    if name == reference_name:
                        hand_on(result, s, None, round_options)
                        while pending:
                            hand_on(*pending.pop(0), result, round_options)
                    elif reference_name is None:
                        hand_on(result, s, None, round_options)
                    else:
                        pending.append((result, s))
                    if result.status == "interrupted":
                        raise Interrupted(results)
                if precision is not None and round_ >= first:
                    widest = statistics.widest_half_width(
                        [Trial.from_record(r.model_dump(mode="json")) for r in trials], reference_name)
                    if widest is None or widest <= precision or round_ == last:
                        on_auto(AutoStop(scenario=s.name, rounds=round_, precision=precision, widest=widest))
                        break
    finally:  # stopped before the round's reference ended: its runs are stored, unjudged
        while pending:
            hand_on(*pending.pop(0), None, options or RunOptions(),
                    f"the round stopped before the reference {reference_name} ran")
    return results


def _judging_reference(result: RunResult, reference: RunResult | None, s: Scenario, options: RunOptions | None,
                       made: dict[tuple[int, str], RunResult]) -> RunResult | None:
    """The reference run `result` is judged against: the round's, or where `result` normalises the
    loss otherwise (`losses.needed_reference_scheme`: XTuner's mean of per-micro-batch means at
    grad_accum 2, HF Trainer's labels counted before the shift, against the torch loop's token mean
    over the step), a run of the reference backend trained that way, made after `result` ended, once
    per round and scheme (`made`). It judges only: not a trial of the reference's speed, so it is not
    stored (its run folder keeps result.json; the run's notes name it)."""
    if reference is None or reference.status not in ("ok", "unverified") or result.status not in ("ok", "unverified"):
        return reference
    scheme = losses.needed_reference_scheme(result, reference)
    if scheme is None:
        return reference
    key = (id(reference), scheme)
    if key not in made:
        made[key] = pipeline.run_one(reference.backend, s, (options or RunOptions()).model_copy(
            update={"loss_scheme": scheme, "db": None}))
    judging = made[key]
    result.notes.append(f"judged against a run of {reference.backend} trained with loss_scheme {scheme} "
                        f"({judging.status}; not stored, not a trial: {judging.run_dir})")
    return judging


def submit(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions,
    *,
    on_scenario: Callable[[Scenario], None] = lambda s: None,
    on_planned: Callable[[str, Scenario, Planned], None] = lambda b, s, p: None,
) -> None:
    """`compare --launcher slurm`: every backend on every scenario written and submitted, the
    reference first (jobs run side by side there, in no order of ours); each other run records the reference's run folder, so `results collect`
    judges it for parity with the reference's result."""
    ordered, reference_name = _reference_first(backend_names)
    for s in scenarios:
        on_scenario(s)
        reference = None
        for name in ordered:
            planned = submit_one(name, s, options, reference=reference)
            if name == reference_name and planned.submission is not None:
                reference = planned.submission.run_dir
            on_planned(name, s, planned)


def plans(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions,
    machine: Machine,
    *,
    on_scenario: Callable[[Scenario], None] = lambda s: None,
    on_plan: Callable[[DryRun, Scenario], None] = lambda d, s: None,
) -> list[DryRun]:
    """`--dry-run`: every backend's plan on every scenario, in the order given; nothing is packed,
    launched or submitted."""
    out = []
    for s in scenarios:
        on_scenario(s)
        for name in backend_names:
            out.append(dry_run(name, s, options, machine))
            on_plan(out[-1], s)
    return out


class TrialCost(BaseModel):
    """What --repeat and the warm-up rounds multiply on one GPU scenario, for `--dry-run`."""
    scenario: str
    trials: tuple[int, int] = Field(description="the fewest and the most counted rounds (apart: --repeat auto)")
    warmup: int
    backends: list[str] = Field(description="those whose own check takes the scenario: one that refuses it is "
                                            "stored at once, for nothing")
    training_s: float = Field(description="one run's expected training: its steps at the estimated step time")
    source: str = Field(description="where the step time comes from")

    def summary(self) -> str:
        fewest, most = self.trials
        trials = f"{fewest}" if fewest == most else f"{fewest} to {most} (--repeat auto)"
        rounds = [(n + self.warmup) * len(self.backends) for n in (fewest, most)]
        runs = f"{rounds[0]}" if fewest == most else f"{rounds[0]} to {rounds[1]}"
        hours = " to ".join(dict.fromkeys(_duration(n * self.training_s) for n in rounds))
        return (f"{trials} trials + {self.warmup} warm-up of {len(self.backends)} backend(s) "
                f"({', '.join(self.backends)}): {runs} runs, ~{hours} of training ({runs} x "
                f"{_duration(self.training_s)}: steps x the step time of the {self.source}) plus each run's start-up")


def trial_cost(scenario: Scenario, planned: list[DryRun], machine: Machine, repeat: int | Literal["auto"],
               warmup_rounds: int | None) -> TrialCost | None:
    """The cost of --repeat on a GPU scenario (None on CPU, or for a single run each): the runs of
    every backend whose own check takes the scenario, times one run's expected training (the
    estimate the SLURM time limit starts from, before its margin and start-up)."""
    first, last = (AUTO_MIN_ROUNDS, AUTO_MAX_ROUNDS) if repeat == "auto" else (repeat, repeat)
    warm = warmup_default(first, scenario) if warmup_rounds is None else warmup_rounds
    if scenario.cluster.device != "cuda" or last + warm <= 1:
        return None
    # A backend's own check refuses the scenario wherever it runs (stored unsupported at once, for
    # nothing); this machine, the env's flavour and memory are judged here, not on the GPU node.
    running = [d.backend for d in planned if d.verdict is not None and not d.verdict.check and not d.plan_error]
    estimate = estimate_time(scenario, verdicts.target_machine(scenario, machine).gpu_name)
    return TrialCost(scenario=scenario.name, trials=(first, last), warmup=warm, backends=running,
                     training_s=estimate.steps * estimate.step_seconds, source=estimate.source)
