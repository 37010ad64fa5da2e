"""What fbench says, line by line, of one run, a plan, a SLURM submission, the runs a command
ended with: rich `Text` (styled, never read as markup, so a name with brackets prints as it is) or
plain sentences, for the command line to print as they are."""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from rich.highlighter import ReprHighlighter
from rich.text import Text

from framework_bench.present.terminal_tables import fmt, is_startup_breakdown

# The statuses in the order a closing line counts them.
_STATUS_ORDER = ("ok", "unverified", "invalid", "failed", "oom", "timeout", "interrupted", "unsupported")
PLAN_FILE_LINES = 40  # of each file a plan wrote, shown under it
_highlighter = ReprHighlighter()


def highlighted(text: Text) -> Text:
    """`text` as rich prints a string it highlights (numbers, paths), its own styles over that: the
    lines of figures."""
    out = _highlighter(text.plain)
    out.copy_styles(text)
    return out


# Exit codes (docs/commands.md, "Failures and exit codes"): 0 every run ok, unverified or unsupported;
# 1 a user error, any run invalid / failed / oom / timeout, or --fail-if-slower; 130 interrupted.
EXIT_INTERRUPTED = 130


def exit_code(results: list) -> int:
    """The exit of a command that ran `results`, before --fail-if-slower (`closing_line` says why)."""
    if any(r.status == "interrupted" for r in results):
        return EXIT_INTERRUPTED
    return 1 if any(r.status not in ("ok", "unsupported", "unverified") for r in results) else 0


def slower_line(slower: list, percent: float, than: str) -> str:
    """--fail-if-slower's reason: 'slower than the reference by more than 5%: tiny_cpu: trl (7.2%)'."""
    return (f"slower {than} by more than {percent:g}%: "
            + "; ".join(f"{r.scenario}: {r.backend} ({(1 - r.ratio) * 100:.1f}%)" for r in slower))


def closing_line(results: list, code: int, why: str | None = None) -> str:
    """`15 runs: 12 ok, 3 unsupported · exit 0: ...`, as pytest's last line counts its tests."""
    counts = Counter(r.status for r in results)
    parts = ", ".join(f"{counts[s]} {s}" for s in sorted(counts, key=lambda s: (_STATUS_ORDER + (s,)).index(s)))
    meaning = why or {0: "no run failed or was judged invalid (unverified and unsupported runs say why above)",
                      1: "a run failed or was judged invalid (why above)", 130: "interrupted"}.get(code, "")
    return f"{len(results)} run(s): {parts or 'none'} · exit {code}: {meaning}"


def time_line(estimate, options) -> str:
    if options.time_limit:
        return f"  time: --time={options.time_limit} (given; the estimate was {estimate.summary()})"
    return f"  time: {estimate.summary()}"


def estimate_line(e, gpu: str | None) -> str:
    """A backend's memory estimate as a dry run heads its plans: with --gpu, the answer first
    ('fits on H200 ...'), then what it is made of."""
    return e.summary() if gpu is None else f"{e.fit_line(gpu)}\n  {e.breakdown()}"


def auto_stop_lines(stops, results) -> list[str]:
    """Where `--repeat auto` stopped on each scenario, whether the cap stopped it, and which
    backends of the scenario no trial of counted (`results`: the runs)."""
    from framework_bench.measure.statistics import Trial, summarise
    from framework_bench.present.verdict import auto_stop_sentence
    summaries = summarise(Trial.from_record(r.model_dump(mode="json")) for r in results)
    return [auto_stop_sentence(stop, sorted(b for (scenario, b), s in summaries.items()
                                            if scenario == stop.scenario and not s.trials)) for stop in stops]


def compare_verdict_lines(compares: dict) -> list[str]:
    """`fbench results list`: the verdicts of each compare of several rounds (`compares`: the stored
    rows by compare, `terminal_tables.by_compare`)."""
    from framework_bench.present.verdict import Points
    from framework_bench.run.reference import reference_backend
    out = []
    for compare_id, trials in compares.items():
        if len({r["trial_round"] for r in trials}) > 1:
            out += [f"compare {compare_id}:", *(f"  {line}" for line in Points(trials, reference_backend()).lines)]
    return out


def check_lines(checks) -> list[Text]:
    """The host's checks of a run, one a line: status, name, detail."""
    colours = {"pass": "green", "fail": "red", "unverified": "yellow", "skipped": "dim"}
    return [Text.assemble("  ", (f"{c.status:10}", colours[c.status]), f" {c.name:10} {c.detail}") for c in checks]


def run_lines(r, db: Path, verbose: bool = False, judges: list = ()) -> list[Text]:
    """One run as `fbench run` shows it: status, figures, notes (the start-up breakdown with
    --verbose), reason, the host's checks; then each run of `judges` (the reference's) that judged it."""
    colour = {"ok": "green", "unverified": "yellow"}.get(r.status, "red")
    version = f" ({r.framework_version})" if r.framework_version else ""
    out = [highlighted(Text.assemble((r.status, colour), f" {r.backend} on {r.scenario}{version}"))]
    if r.status in ("ok", "unverified"):
        mem = "-" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**30:.2f} GiB"
        reserved = "" if r.peak_reserved_bytes is None else f", {r.peak_reserved_bytes / 2**30:.2f} GiB reserved"
        out += [highlighted(Text(f"TGS {fmt(r.tgs)} (min {fmt(r.tgs_min)}, max {fmt(r.tgs_max)}) over {r.steps_measured} "
                                f"measured steps; TFLOPs/GPU {fmt(r.tflops, '.3g')} (XTuner formula), "
                                f"{fmt(r.model_tflops, '.3g')} (model FLOPs); step {fmt(r.step_seconds, '.3f')} s")),
                highlighted(Text(f"peak memory {mem}{reserved} (max over measured steps); "
                                f"start-up {fmt(r.startup_seconds, '.1f')} s (worker start to first step)"))]
        if r.flags:
            out.append(highlighted(Text.assemble((f"flags: {'; '.join(r.flags)}", "yellow"))))
    out += [Text(f"note: {note}") for note in r.notes if verbose or not is_startup_breakdown(note)]
    if r.reason:
        out.append(Text(r.reason))
    out += check_lines(r.checks)
    out.append(highlighted(Text(f"data sha256 {r.data_sha256}; {r.settings_mode} settings")))
    if r.run_dir:
        out.append(highlighted(Text(f"run folder {r.run_dir}")))
    if r.result_id is not None:  # else kept beside the store, as said above
        out.append(Text(f"stored as result {r.result_id} in {db}"))
    return out + [Text(f"judged against {j.backend}'s run: {j.status}" + (f", TGS {fmt(j.tgs)}" if j.tgs else "")
                       + (f", stored as result {j.result_id}" if j.result_id is not None else "")) for j in judges]


def reason_lines(results: list) -> list[Text]:
    """Why each run that is not ok ended so (first line, then the log tail); the backends of a
    scenario that ended alike for one reason (three QLoRA refusals) on one line."""
    said: dict[tuple, list] = {}
    for r in results:
        if r.status != "ok":
            lines = (r.reason or "").splitlines()
            first = (lines[0] if lines else "").removeprefix(f"{r.backend}: ")
            said.setdefault((r.scenario, r.status, first) + (() if len(lines) <= 1 else (id(r),)), []).append(r)
    out = []
    for (scenario, status, first, *_), runs in said.items():
        out.append(Text.assemble((f"{scenario} / {', '.join(r.backend for r in runs)}: {status}", "yellow"), f": {first}"))
        out += [Text(f"    {line}") for line in (runs[0].reason or "").splitlines()[1:][-8:]]
    return out


def refusal_lines(name: str, launcher: str, refusals) -> list[Text]:
    """Every refusal on its own line: this machine, the env, the backend's check, memory."""
    if refusals.reason is None:
        head = Text("checks pass on this machine", style="green")
    elif refusals.refused_by_backend:
        head = Text("refused", style="red")
    else:
        head = Text.assemble(("not runnable on this machine", "yellow"),
                             "; the backend's checks pass for the scenario's nodes")
    out = [Text.assemble((name, "bold"), f" via {launcher}: ", head)]
    for label, text in (("this machine", refusals.machine), (f"{name} env", refusals.env), (name, refusals.check),
                        ("memory", refusals.memory)):
        if text:
            out.append(Text(f"  {label}: {text}"))
    return out


def estimate_lines(plans: list, settings_mode: str, gpu: str | None) -> list[str]:
    """Each backend's own memory estimate in this settings mode (its declared AdamW and
    sequence-parallel engine), the figure of its refusals and plan lines: one line per distinct
    estimate, naming the backends it is theirs."""
    by_estimate: dict[str, list[str]] = {}
    for d in plans:
        if d.refusals is not None and d.refusals.estimate is not None:
            by_estimate.setdefault(estimate_line(d.refusals.estimate, gpu), []).append(d.backend)
    return [f"{', '.join(names)} ({settings_mode} settings): {summary}" for summary, names in by_estimate.items()]


def plan_lines(d, options) -> list[Text]:
    """One dry-run plan: the refusals, then the command, its environment and the files it wrote."""
    if d.refusals is not None:
        out = refusal_lines(d.backend, d.launcher, d.refusals)
    else:
        out = [Text.assemble((d.backend, "bold"), f" via {d.launcher}: ", ("refused", "red"), f" {d.check or ''}")]
    if d.plan_error:
        return out + [Text.assemble("  ", ("no plan:", "red"), f" {d.plan_error}")]
    if d.time is not None:
        out.append(Text(time_line(d.time, options.sbatch)))
    if (e := d.refusals and d.refusals.estimate) is not None:  # per phase, as this backend declares its AdamW
        out.append(Text(f"  memory: ~{e.total_gib:.1f} GiB at the {e.peak_phase} ({e.phases_line()}; "
                        f"{e.optimizer_impl} AdamW, {'DDP-wrapped' if e.ddp_wrapped else 'not DDP-wrapped'})"))
    out.append(Text(f"  argv: {shlex.join(d.argv)}"))
    out += [Text(f"  env:  {k}={v}") for k, v in sorted(d.env.items())]
    for role, path in d.files.items():
        out.append(Text(f"  file ({role}): {path}"))
        if path.is_dir():
            lines = [f"{p.name}" for p in sorted(path.iterdir())]
        else:
            lines = path.read_text().splitlines() if path.exists() else []
        out += [Text(f"    | {line}") for line in lines[:PLAN_FILE_LINES]]
        if len(lines) > PLAN_FILE_LINES:
            out.append(Text(f"    | ... ({len(lines) - PLAN_FILE_LINES} more lines)"))
    return out


def submission_lines(name: str, p, options) -> list[Text]:
    """One backend x scenario given to SLURM: the refusals, then the script and the job, or nothing."""
    out = refusal_lines(name, "slurm", p.refusals)
    if p.result is not None:
        return out
    out += [Text(time_line(p.time, options.sbatch)), Text(f"  sbatch: {p.sbatch}")]
    if p.note:
        out.append(Text.assemble("  ", (p.note, "yellow")))
    if p.submission:
        out.append(Text(f"  submitted: SLURM job {p.submission.job_id}"))
    return out


def collected_lines(results: list, still: list) -> list[Text]:
    """`fbench results collect`: each run stored (a failure's log tail under it), then each SLURM
    job still queued or running (`still`: (submission, queue state))."""
    from framework_bench.run.collect import steps_done
    out = []
    for r in results:
        tgs = f", TGS {r.tgs:,.1f} over {r.steps_measured} measured steps" if r.tgs else ""
        out.append(Text.assemble((r.status, "green" if r.status == "ok" else "red"),
                                 f" {r.backend} on {r.scenario}: stored as result {r.result_id}{tgs}"))
        if r.status != "ok" and r.reason:
            out += [Text(f"    {line}") for line in r.reason.splitlines()[-8:]]
    return out + [Text.assemble((state.state.lower(), "yellow"), f" SLURM job {sub.job_id}: {sub.backend} on "
                                f"{sub.scenario}, {steps_done(sub)} steps so far ({sub.run_dir})") for sub, state in still]
