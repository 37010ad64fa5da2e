"""How runs, plans, checks and verdicts are printed: tables and lines, no logic of their own."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from framework_bench.cli import common


def fmt(x: float | None, spec: str = ",.1f") -> str:
    return "-" if x is None else format(x, spec)


def ctx(n: int) -> str:
    for div, suffix in ((1024 * 1024, "M"), (1024, "k")):
        if n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def result_dict(r) -> dict:
    return r.model_dump(mode="json")


def results_table(results, scenarios_by_name) -> Table:
    from framework_bench.run.compare import percent_of_reference, reference_backend
    # one compare: every run of a scenario ran its one definition
    share = percent_of_reference([(r.scenario, r.backend, r.status, r.tgs, "") for r in results])
    t = Table("scenario", "backend", "status", "TGS (min–max)", f"% of {reference_backend() or 'reference'}", "TFLOPs/GPU", "MFU",
              "peak mem", "start-up", "published TGS", "notes", title="fbench compare")
    for r in results:
        s = scenarios_by_name[r.scenario]
        spread = f" ({fmt(r.tgs_min)}–{fmt(r.tgs_max)})" if r.tgs is not None else ""
        colour = "green" if r.status == "ok" else ("yellow" if r.status == "unsupported" else "red")
        mem = f"{r.peak_mem_bytes / 2**30:.2f} GiB" if r.peak_mem_bytes else "-"
        if r.peak_reserved_bytes:
            mem += f" ({r.peak_reserved_bytes / 2**30:.2f} reserved)"
        ref = f"{s.reference.tgs:,.1f} ({s.reference.hardware})" if s.reference else "-"
        notes = escape("; ".join(r.flags + r.notes)) if r.status == "ok" else "see below"
        pct = share.get((r.scenario, r.backend))
        t.add_row(r.scenario, r.backend, f"[{colour}]{r.status}[/{colour}]", fmt(r.tgs) + spread,
                  "-" if pct is None else f"{pct:.0f}%", fmt(r.tflops, ".3g"), fmt(r.mfu * 100 if r.mfu is not None else None, ".1f") + ("%" if r.mfu else ""),
                  mem, fmt(r.startup_seconds, ".1f") + (" s" if r.startup_seconds is not None else ""), ref, notes)
    return t


def print_checks(checks) -> None:
    colours = {"pass": "green", "fail": "red", "unverified": "yellow"}
    for c in checks:
        common.console.print(f"  [{colours[c.status]}]{c.status:10}[/{colours[c.status]}] {c.name:10} {escape(c.detail)}",
                      highlight=False)


def print_differences(records: list[dict], mode: str) -> None:
    """One line per setting that differs between the backends of a scenario."""
    from framework_bench.run.compare import setting_differences
    for name, diffs in setting_differences(records).items():
        common.console.print(f"[bold]{escape(name)}[/bold]: {len(diffs)} setting(s) differ between backends "
                      f"({mode} settings)" if diffs else f"[bold]{escape(name)}[/bold]: same settings on every backend",
                      highlight=False)
        for key, values, speed in diffs:
            shown = ", ".join(f"{b} {v}" for b, v in values.items())
            common.console.print(("  [yellow]speed[/yellow] " if speed else "        ") + escape(f"{key}: {shown}"),
                          highlight=False)


def print_reasons(results: list) -> None:
    """Below a results table: why each run that is not ok ended so (first line, then the log tail)."""
    for r in results:
        if r.status != "ok":
            lines = (r.reason or "").splitlines()
            common.console.print(f"[yellow]{r.scenario} / {r.backend}: {r.status}[/yellow]: {escape(lines[0] if lines else '')}",
                          highlight=False)
            for line in lines[1:][-8:]:
                common.console.print(f"    {line}", highlight=False, markup=False)


def time_line(estimate, options) -> str:
    if options.time_limit:
        return f"  time: --time={options.time_limit} (given; the estimate was {estimate.summary()})"
    return f"  time: {estimate.summary()}"


def print_verdict(name: str, launcher: str, verdict, show=common.console) -> None:
    """Every refusal on its own line: this machine, the env, the backend's check, memory."""
    if verdict.reason is None:
        head = "[green]checks pass on this machine[/green]"
    elif verdict.refused_by_backend:
        head = "[red]refused[/red]"
    else:
        head = "[yellow]not runnable on this machine[/yellow]; the backend's checks pass for the scenario's nodes"
    show.print(f"[bold]{escape(name)}[/bold] via {launcher}: {head}", highlight=False)
    for label, text in (("this machine", verdict.machine), (f"{name} env", verdict.env), (name, verdict.check),
                        ("memory", verdict.memory)):
        if text:
            show.print(f"  {label}: {text}", highlight=False, markup=False)



def print_run(r, db: Path) -> None:
    """One run as `fbench run` shows it: status, figures, notes, reason, the host's checks."""
    console = common.console
    colour = "green" if r.status == "ok" else "red"
    console.print(f"[{colour}]{r.status}[/{colour}] {r.backend} on {r.scenario}"
                  + (f" ({r.framework_version})" if r.framework_version else ""))
    if r.status == "ok":
        console.print(f"TGS {fmt(r.tgs)} (min {fmt(r.tgs_min)}, max {fmt(r.tgs_max)}) over {r.steps_measured} "
                      f"measured steps; TFLOPs/GPU {fmt(r.tflops, '.3g')} (XTuner formula), "
                      f"{fmt(r.model_tflops, '.3g')} (model FLOPs); step {fmt(r.step_seconds, '.3f')} s")
        mem = "-" if r.peak_mem_bytes is None else f"{r.peak_mem_bytes / 2**30:.2f} GiB"
        reserved = "" if r.peak_reserved_bytes is None else f", {r.peak_reserved_bytes / 2**30:.2f} GiB reserved"
        console.print(f"peak memory {mem}{reserved} (max over measured steps); "
                      f"start-up {fmt(r.startup_seconds, '.1f')} s (worker start to first step)")
        if r.flags:
            console.print(f"[yellow]flags: {'; '.join(r.flags)}[/yellow]")
    for note in r.notes:
        console.print(f"note: {note}", highlight=False, markup=False)
    if r.reason:
        console.print(r.reason, highlight=False, markup=False)
    print_checks(r.checks)
    console.print(f"data sha256 {r.data_sha256}; {r.settings_mode} settings")
    if r.run_dir:
        console.print(f"run folder {r.run_dir}")
    if r.result_id is not None:  # else kept beside the store, as said above
        console.print(f"stored as result {r.result_id} in {db}", highlight=False, markup=False)


def print_plan(d, s, options, machine, show) -> None:
    """One dry-run plan: the verdicts, then the command, its environment and the files it wrote."""
    import shlex

    from framework_bench.measure.memory import estimate
    from framework_bench.plugins import registry as plugins

    if d.verdict is not None:
        print_verdict(d.backend, d.launcher, d.verdict, show)
    else:
        show.print(f"[bold]{escape(d.backend)}[/bold] via {d.launcher}: [red]refused[/red] {escape(d.check or '')}",
                   highlight=False)
    if d.plan_error:
        show.print(f"  [red]no plan:[/red] {escape(d.plan_error)}", highlight=False)
        return
    if d.time is not None:
        show.print(time_line(d.time, options.sbatch), highlight=False, markup=False)
    if s.cluster.device == "cuda":  # per phase, as this backend declares its AdamW in this mode
        e = estimate(s, declared=plugins.get(d.backend).info.memory, settings_mode=options.settings_mode,
                     gpu_memory_gib=machine.gpu_memory_gib, gpu=s.reference.hardware if s.reference else None)
        show.print(f"  memory: ~{e.total_gib:.1f} GiB at the {e.peak_phase} ({e.phases_line()}; "
                   f"{e.optimizer_impl} AdamW, {'DDP-wrapped' if e.ddp_wrapped else 'not DDP-wrapped'})",
                   highlight=False, markup=False)
    show.print(f"  argv: {shlex.join(d.argv)}", highlight=False, markup=False)
    for k, v in sorted(d.env.items()):
        show.print(f"  env:  {k}={v}", highlight=False, markup=False)
    for role, path in d.files.items():
        show.print(f"  file ({role}): {path}", highlight=False, markup=False)
        if path.is_dir():
            lines = [f"{p.name}" for p in sorted(path.iterdir())]
        else:
            lines = path.read_text().splitlines() if path.exists() else []
        for line in lines[:40]:
            show.print(f"    | {line}", highlight=False, markup=False)
        if len(lines) > 40:
            show.print(f"    | ... ({len(lines) - 40} more lines)", highlight=False, markup=False)


def print_submission(name: str, p, options) -> None:
    """One backend x scenario given to SLURM: the verdicts, then the script and the job, or nothing."""
    print_verdict(name, "slurm", p.verdict)
    if p.result is not None:
        return
    common.console.print(time_line(p.time, options.sbatch), highlight=False, markup=False)
    common.console.print(f"  sbatch: {p.sbatch}", highlight=False, markup=False)
    if p.note:
        common.console.print(f"  [yellow]{escape(p.note)}[/yellow]", highlight=False)
    if p.submission:
        common.console.print(f"  submitted: SLURM job {p.submission.job_id}", highlight=False)
