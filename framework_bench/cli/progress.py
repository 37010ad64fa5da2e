"""A campaign's events as the terminal shows them (`run/campaign.py`'s `Events`): a bar per run
(its steps, then its status and TGS once judged and stored), the SLURM rounds and submissions, a
bar per job waited for."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.markup import escape
from rich.progress import Progress as Bars

from framework_bench.cli import common, render
from framework_bench.present import run_lines
from framework_bench.run import collect
from framework_bench.run.campaign import Events, Request


class Progress(Events):
    """`request`: the campaign's (None: `results collect`'s, whose jobs get a bar only when waited for)."""

    def __init__(self, request: Request | None = None):
        self.request = request
        self.bars = Bars(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                         TextColumn("{task.fields[note]}"), TimeElapsedColumn(), console=common.err, transient=False)
        self.tasks: dict = {}
        self.problems: list[str] = []  # the submitted runs that could not be stored, each said once

    def __enter__(self) -> "Progress":
        if self.request and self.request.options.launcher != "slurm" and not self.request.dry_run:
            self.bars.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.bars.stop()

    def recovered(self, line) -> None:
        common.err.print(f"[yellow]{escape(line)}[/yellow]", highlight=False, soft_wrap=True)

    def env(self, line) -> None:
        common.err.print(line, highlight=False, markup=False, soft_wrap=True)

    def run_started(self, backend, s) -> None:
        if "current" in self.tasks:  # runs go one at a time: the one before has ended, its clock stops
            self.bars.stop_task(self.tasks["current"])
        self.tasks["current"] = self.tasks[backend] = self.bars.add_task(f"{backend} · {s.name}", total=s.steps.total,
                                                                         note="starting")

    def step(self, done, total, secs) -> None:
        self.bars.update(self.tasks["current"], completed=done, note=f"step {secs:.2f} s" if secs else "")

    def result(self, r, s) -> None:  # once judged and stored: the round's others after its reference
        self.bars.stop_task(self.tasks[r.backend])  # its time is its run's, not the campaign's so far
        self.bars.update(self.tasks[r.backend], note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else ""))

    def kept(self, path) -> None:
        common.say_kept(path)

    def scenario_submitted(self, s) -> None:
        common.console.rule(f"{s.name}: {s.cluster.nodes} node(s) x {s.cluster.gpus_per_node} {s.cluster.device}")

    def round_submitted(self, s, number, order) -> None:
        if self.request.repeat != 1 or len(order) > 1:
            common.console.print(f"round {number}/{self.request.repeat}: one job runs {', '.join(order)}, in that order",
                                 highlight=False)

    def planned(self, name, s, p) -> None:
        render.say(run_lines.submission_lines(name, p, self.request.options))
        if p.result is not None:
            common.console.print(f"  nothing submitted; stored as result {p.result.result_id}", highlight=False)

    def jobs_waited(self, subs) -> None:
        for sub in subs:
            self.tasks[sub.run_dir] = self.bars.add_task(f"job {sub.job_id} · {sub.backend} · {sub.scenario}",
                                                         total=collect.scenario_of(sub).steps.total, note="submitted")
        self.bars.start()

    def collected(self, r, sub) -> None:
        if sub.run_dir not in self.tasks:  # collected without waiting: no bar
            return
        self.bars.update(self.tasks[sub.run_dir], completed=collect.steps_done(sub),
                         note=f"{r.status}" + (f" · TGS {r.tgs:,.1f}" if r.tgs else "") + f" · stored as {r.result_id}")

    def problem(self, sub, why) -> None:
        self.problems.append(why)
        if sub.run_dir in self.tasks:
            self.bars.update(self.tasks[sub.run_dir], note=f"not stored: {why}")
        common.err.print(f"[red]not stored[/red] SLURM job {sub.job_id} ({escape(sub.backend)} on {escape(sub.scenario)}, "
                         f"{escape(str(sub.run_dir))}): {escape(why)}; the others are collected", highlight=False,
                         soft_wrap=True)

    def waiting(self, sub, state) -> None:
        self.bars.update(self.tasks[sub.run_dir], completed=collect.steps_done(sub), note=state.state.lower())
