"""The host checks what a worker claims, from the host's own inputs (never the worker's word).

After a run, `verify(...)` compares the worker's report with what the scenario and the
host's packed stream say it must be:
  - tokens: every step of every rank carries micro batch x context x grad accum / SP tokens;
  - steps: every warm-up and measured optimizer step, numbered 1..N without gaps, on every rank;
  - rows: the rows each step fed to the trainer (`framework_bench/worker/rows.py`) are the
    rows that step must consume from the packed stream, input ids and labels alike;
  - throughput: the framework's own tokens/s figure within 10 % of the host's;
  - parameters: the model the framework built has the scenario's parameter count (its
    LoRA adapters included);
  - trainable: the parameters taking gradients, as the worker counted them on its live model,
    are the host's count from the model and the fine-tuning method (every one for full
    fine-tuning, the adapters only with the base frozen for LoRA/QLoRA);
  - settings: the worker recorded the settings in effect (`framework_bench/worker/settings.py`);
  - initial_weights: the sampled initial weights read from the live model are the compare's
    (seed, name, index) values (`framework_bench/worker/initial_weights_host.py`), over every parameter;
  - anchor, only where one applies (`ANCHORS`): the step time within 10 % of a figure
    measured once for the same loop, scenario and GPU; outside it, flagged (clocks,
    thermals or a regression: the reader should look before trusting the row).
  - parity, judged by the referee (`framework_bench/run/referee.py`) against the reference's run
    on the same rows and seed, which every command runs (in each round of a compare): the
    canonical loss at every step where both weigh tokens alike, step 1 otherwise
    (`framework_bench/measure/losses.py`);
  - update and update_parity: the projection of (final - initial) weights onto a vector whose
    seed the host revealed after the last step, non-zero and (with a reference) equal to the
    reference's (`framework_bench/measure/update.py`); with LoRA adapters, the frozen base's
    part unmoved (0 but for rounding: `update.unmoved`) and the adapters' non-zero; update_parts: each part of the model (embeddings,
    each decoder layer, final norm, head, adapters) moved as the reference's part did;
A claim that is reported and wrong is a failed check and makes the run `invalid`; a claim a
plugin does not report (one written before these checks) is `unverified` and only flagged.
A throughput disagreement is flagged, not invalidating: the frameworks time other windows.
"""

from __future__ import annotations

import json
import os
import statistics
from collections import Counter, defaultdict
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.worker import initial_weights_host
from framework_bench.plugins.contract import Job, StepMetric, WorkerReport
from framework_bench.worker.packed import PackedRows
from framework_bench.scenario.models import parameter_count
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.rows import row_fingerprint

THROUGHPUT_TOLERANCE = 0.10
# Checks whose failure makes a run invalid; the others are flagged only.
BLOCKING = ("tokens", "steps", "rows", "parameters", "trainable", "initial_weights", "parity",
            "clock", "pauses", "gaps", "warmup", "cpu", "losses_in_time", "update", "update_parity",
            "update_parts", "fp32_twin", "dropout_twin", "initial_reveal", "first_window", "warmup_update", "warmup_update_parity",
            "median_step")
# Tests only: check names (comma-separated) left out of the judgement, so that a test can show
# that a lie it catches with the check would pass without it (the lie is live); `claims` leaves
# out the rule of the current contract that every claim be made (one not made is then a flag).
# A figure anyone reads is never judged with it.
UNCHECKED_ENV = "FBENCH_UNCHECKED"
CLAIMS = "claims"
# What every worker must record; `fbench check-backend` requires them.
REQUIRED_SETTINGS = ("trainer", "optimizer", "optimizer_impl", "param_dtype", "attention",
                     "activation_checkpointing", "zero_stage")
# The plugin contract (`framework_bench.plugins.contract.CONTRACT`) from which each claim is
# required; every claim not named here is required from contract 2.
CLAIMED_SINCE = {"update": 3, "initial_reveal": 4, "warmup_update": 5}


def claimed_since(check: str) -> int:
    """The first plugin contract that requires the claim `check` verifies."""
    return CLAIMED_SINCE.get(check, 2)


class Check(BaseModel):
    name: str
    # skipped: a conformance variant the backend refuses, or a comparison that does not apply
    status: Literal["pass", "fail", "unverified", "skipped"]
    detail: str = ""
    figures: dict[str, float | int | str | bool | None] = Field(
        default_factory=dict, description="what the check measured (the host clock's seconds, shares...)")


def check_tokens(scenario: Scenario, steps: list[StepMetric]) -> Check:
    want = scenario.tokens_per_gpu_step
    wrong = [m for m in steps if m.tokens != want]
    if not steps:
        return Check(name="tokens", status="fail", detail="no step records")
    if wrong:
        m = wrong[0]
        return Check(name="tokens", status="fail",
                     detail=f"{len(wrong)} step record(s) off: rank {m.rank} step {m.step} reports {m.tokens} "
                            f"tokens, the scenario makes {want} (micro batch x context / SP x micro-iterations per step)")
    return Check(name="tokens", status="pass", detail=f"{want} tokens per step per rank")


def check_steps(scenario: Scenario, steps: list[StepMetric]) -> Check:
    total, ranks = scenario.steps.total, scenario.cluster.gpus
    by_rank: dict[int, list[int]] = defaultdict(list)
    for m in steps:
        by_rank[m.rank].append(m.step)
    problems = []
    for rank in range(ranks):
        got = by_rank.get(rank, [])
        if got != list(range(1, total + 1)):
            missing = sorted(set(range(1, total + 1)) - set(got))
            extra = sorted(s for s, n in Counter(got).items() if n > 1 or s > total)
            problems.append(f"rank {rank}: " + ", ".join(
                p for p in (f"missing {missing}" if missing else "", f"repeated or extra {extra}" if extra else "",
                            "out of order" if not missing and not extra else "") if p))
    strays = sorted(set(by_rank) - set(range(ranks)))
    if strays:
        problems.append(f"records from ranks {strays} outside the {ranks} processes")
    if problems:
        return Check(name="steps", status="fail", detail="; ".join(problems))
    return Check(name="steps", status="pass",
                 detail=f"steps 1..{total} ({scenario.steps.warmup} warm-up) on each of {ranks} rank(s)")


def rows_per_step(scenario: Scenario) -> int:
    """Distinct packed rows one step (of `steps.unit`) consumes across all data-parallel ranks."""
    return scenario.micro_batch * scenario.micro_per_step * scenario.data_parallel


def check_rows(scenario: Scenario, consumed: dict[int, dict[int, list[str]]] | None, data_dir: Path) -> Check:
    if consumed is None:
        return Check(name="rows", status="unverified", detail="unverified: the worker recorded no consumed rows")
    packed = PackedRows(data_dir)
    per_step, total = rows_per_step(scenario), scenario.steps.total
    need = per_step * total
    if packed.rows < need:
        return Check(name="rows", status="fail", detail=f"the stream holds {packed.rows} rows, the run needs {need}")
    expected = [row_fingerprint(packed.input_ids[r], packed.labels[r]) for r in range(need)]
    index = {fp: r for r, fp in enumerate(expected)}
    for step in range(1, total + 1):
        fed = Counter(fp for steps in consumed.values() for fp in steps.get(step, []))
        block = expected[(step - 1) * per_step: step * per_step]
        want = Counter({fp: scenario.sequence_parallel for fp in block})
        if fed != want:
            strange = [fp for fp in fed if fp not in want]
            where = ", ".join(f"row {index[fp]}" if fp in index else "a row not in the stream" for fp in strange[:3])
            return Check(name="rows", status="fail", detail=(
                f"step {step} fed {sum(fed.values())} row(s) ({where or 'wrong counts'}), not stream rows "
                f"{(step - 1) * per_step}..{step * per_step - 1} x SP {scenario.sequence_parallel}"))
    return Check(name="rows", status="pass", detail=f"rows 0..{need - 1} in order, input ids and labels")


def host_throughput(scenario: Scenario, steps: list[StepMetric], whole_run: bool) -> float | None:
    """Tokens per second per GPU over the measured steps (or all steps), as total tokens / total seconds."""
    by_step: dict[int, list[StepMetric]] = defaultdict(list)
    for m in steps:
        if whole_run or m.step > scenario.steps.warmup:
            by_step[m.step].append(m)
    if not by_step:
        return None
    tokens = sum(statistics.mean(m.tokens for m in ms) for ms in by_step.values())
    seconds = sum(max(m.seconds for m in ms) for ms in by_step.values())
    return tokens / seconds


def check_throughput(scenario: Scenario, report: WorkerReport, host_tgs: float | None) -> Check:
    """Compares like windows: the framework's median per-step rate with the host's median TGS,
    its mean over the measured steps with the host's, or its whole-run figure with the host's
    whole-run figure (LLaMA-Factory's HF Trainer publishes only that one)."""
    own = report.framework_throughput
    if "tokens_per_sec_median" in own:
        key, host = "tokens_per_sec_median", host_tgs
    elif "tokens_per_sec" in own:
        key, host = "tokens_per_sec", host_throughput(scenario, report.steps, whole_run=False)
    elif "tokens_per_sec_whole_run" in own:
        key, host = "tokens_per_sec_whole_run", host_throughput(scenario, report.steps, whole_run=True)
    else:
        return Check(name="throughput", status="unverified", detail="unverified: no framework throughput figure")
    if not host:
        return Check(name="throughput", status="unverified", detail="unverified: no host figure to compare")
    ratio = own[key] / host
    detail = f"framework {key} {own[key]:,.1f} vs host {host:,.1f} ({ratio - 1:+.1%})"
    return Check(name="throughput", status="pass" if abs(ratio - 1) <= THROUGHPUT_TOLERANCE else "fail",
                 figures={"ratio": round(ratio, 6)}, detail=detail)


def adapter_count(scenario: Scenario, settings: dict, mode: str) -> int:
    """The adapters' parameters the host expects: the scenario's own in matched mode; in
    native mode (each framework's default rank and targets) those of the rank, targets and
    head the worker's live model holds, counted here from the model's shapes."""
    arch, ft = scenario.arch, scenario.finetune
    if ft.method == "full":
        return 0
    if mode == "matched":
        return ft.adapter_parameter_count(arch)
    rank, targets = settings.get("lora_rank"), str(settings.get("lora_targets") or "").split(",")
    shapes = arch.linear_shapes
    if not isinstance(rank, int) or not all(t in shapes for t in targets):
        return ft.adapter_parameter_count(arch)  # unreadable: the trainable check says so
    head = rank * (arch.hidden_size + arch.vocab_size) if settings.get("lora_head_adapted") else 0
    return ft.model_copy(update={"rank": rank, "targets": targets}).adapter_parameter_count(arch) + head


def expected_parameters(scenario: Scenario, settings: dict, mode: str) -> int:
    """Every parameter of the built model: the scenario's config, plus its adapters."""
    return parameter_count(scenario.arch) + adapter_count(scenario, settings, mode)


def check_parameters(scenario: Scenario, report: WorkerReport, mode: str = "matched") -> Check:
    want = expected_parameters(scenario, report.settings or {}, mode)
    if report.param_count is None:
        return Check(name="parameters", status="unverified", detail="unverified: the worker reported no parameter count")
    if report.param_count != want:
        return Check(name="parameters", status="fail",
                     detail=f"the built model has {report.param_count:,} parameters, the scenario's config {want:,}")
    return Check(name="parameters", status="pass", detail=f"{want:,} parameters")


def check_trainable(scenario: Scenario, report: WorkerReport, mode: str = "matched") -> Check | None:
    """The parameters that took gradients, as the worker counted them on its live model
    (`trainable_params`), against the host's count from the model and the fine-tuning method:
    every one for full fine-tuning, the adapters only for LoRA/QLoRA (so a frozen base that
    trains, or adapters on other modules or of another rank, cannot pass). None for a full
    run whose worker counts none (a worker SDK before the finetune axis)."""
    settings, lora = report.settings or {}, scenario.finetune.method != "full"
    got = settings.get("trainable_params")
    if got is None:
        return Check(name="trainable", status="unverified",
                     detail="unverified: the worker counted no trainable parameters") if lora else None
    want = adapter_count(scenario, settings, mode) if lora else parameter_count(scenario.arch)
    what = (f"the adapters' ({settings.get('lora_targets')}, r={settings.get('lora_rank')}"
            f"{', the LM head too' if settings.get('lora_head_adapted') else ''})" if lora else "every parameter")
    if got != want:
        return Check(name="trainable", status="fail",
                     detail=f"{got:,} parameters take gradients, the host counts {want:,}: {what}")
    if lora and settings.get("base_frozen") is not True:
        return Check(name="trainable", status="fail", detail="the worker's adapted base layers take gradients")
    return Check(name="trainable", status="pass", detail=f"{want:,} trainable: {what}")


def check_settings(report: WorkerReport) -> Check:
    if not report.settings:
        return Check(name="settings", status="unverified", detail="unverified: the worker recorded no settings")
    missing = [k for k in REQUIRED_SETTINGS if k not in report.settings]
    if missing:
        return Check(name="settings", status="fail", detail=f"settings lack {', '.join(missing)}")
    return Check(name="settings", status="pass", detail=f"{len(report.settings)} settings recorded")


def check_initial_weights(job: Job, settings: dict | None = None) -> Check:
    """The worker's sampled initial weights (`RUN_DIR/initial_weights.json`) against the host's
    own computation of the same elements, adapters included."""
    path = job.run_dir / initial_weights_host.REPORT_FILE
    report = json.loads(path.read_text()) if path.exists() else None
    want = expected_parameters(job.scenario, settings or {}, job.settings_mode)
    status, detail = initial_weights_host.check(report, job.seed, job.hf_config, want,
                                                adapters=bool(job.scenario.finetune.adapters))
    return Check(name="initial_weights", status=status, detail=detail)


class Anchor(BaseModel):
    """A step time measured once, which a run of the same loop on the same scenario and GPU
    should reproduce within `tolerance`."""

    scenario: str
    trainer: str = Field(description="the `trainer` setting of the loop it was measured with")
    gpu: str = Field(description="part of the GPU's name (the worker's `device_name` setting)")
    step_seconds: float
    tolerance: float = 0.10
    source: str


ANCHORS = [
    Anchor(scenario="llama2_7b_8k_1gpu", trainer="torch-loop", gpu="H200", step_seconds=1.170,
           source="plain PyTorch on one H200, Llama2-7B random init, batch 1, bf16 autocast over fp32 "
                  "weights, SDPA, activation checkpointing, fused AdamW"),
]


def check_anchor(scenario: Scenario, report: WorkerReport) -> Check | None:
    """The median measured step time (slowest rank) against the anchor for this run, if any."""
    settings = report.settings or {}
    anchor = next((a for a in ANCHORS if a.scenario == scenario.name and a.trainer == settings.get("trainer")
                   and a.gpu.lower() in str(settings.get("device_name") or "").lower()), None)
    by_step: dict[int, list[float]] = defaultdict(list)
    for m in report.steps:
        if m.step > scenario.steps.warmup:
            by_step[m.step].append(m.seconds)
    if anchor is None or not by_step:
        return None
    seconds = statistics.median(max(s) for s in by_step.values())
    off = seconds / anchor.step_seconds - 1
    detail = (f"step {seconds:.3f} s vs {anchor.step_seconds:.3f} s ({off:+.1%}) measured for {anchor.scenario} "
              f"on {anchor.gpu} ({anchor.source})")
    if abs(off) <= anchor.tolerance:
        return Check(name="anchor", status="pass", detail=detail)
    return Check(name="anchor", status="fail", detail=f"{detail}: outside ±{anchor.tolerance:.0%}; clocks, thermals "
                 "or a regression, look before trusting this row")


def verify(scenario: Scenario, report: WorkerReport, data_dir: Path, host_tgs: float | None,
           job: Job | None = None) -> list[Check]:
    """`job`: the run's job, for the checks of what the worker left in its run folder."""
    mode = job.settings_mode if job is not None else "matched"
    checks = [check_tokens(scenario, report.steps), check_steps(scenario, report.steps),
              check_rows(scenario, report.consumed_rows, data_dir), check_throughput(scenario, report, host_tgs),
              check_parameters(scenario, report, mode), check_settings(report)]
    if (trainable := check_trainable(scenario, report, mode)) is not None:
        checks.append(trainable)
    if job is not None:
        checks.append(check_initial_weights(job, report.settings))
    anchor = check_anchor(scenario, report)
    return checks + ([anchor] if anchor else [])


def unchecked() -> set[str]:
    """The check names `FBENCH_UNCHECKED` leaves out (tests only)."""
    return {n for n in os.environ.get(UNCHECKED_ENV, "").split(",") if n}


def fold(checks: list[Check]) -> tuple[str | None, list[str]]:
    """(the reason the run is invalid or None, flags for the rest)."""
    checks = [c for c in checks if c.name not in unchecked()]
    failed = [c for c in checks if c.status == "fail" and c.name in BLOCKING]
    flags = [f"{c.name}: {c.detail}" for c in checks
             if c.status == "unverified" or (c.status == "fail" and c.name not in BLOCKING)]
    reason = "; ".join(f"{c.name} check failed: {c.detail}" for c in failed) or None
    return reason, flags
