"""`fbench device ...`: the offline GPU machine: its bundle, its check and the check's estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from framework_bench.cli import common
from framework_bench.measure import gpus

device_app = common.Typer(no_args_is_help=True, help="The offline one-GPU machine: bundle, check, estimate.\n\n"
                                                     "Example: fbench device estimate --gpu H200")
console = Console(highlight=False)


@device_app.command("bundle")
def bundle(
    dest: Annotated[Path, typer.Argument(
        metavar="FOLDER", help="folder for the bundle (wheels/, requirements-*.txt, data/, manifest.json)")],
    python: Annotated[str, typer.Option("--python", metavar="VERSION", help="the target machine's Python, MAJOR.MINOR")] = "3.12",
    max_mib: Annotated[float | None, typer.Option(
        "--max-mib", metavar="MIB", help="refuse a bundle larger than this (default: what leaves the checkout room "
                                         "in the 64 MiB that travel to the device machine)")] = None,
) -> None:
    """Fetch (or build) the wheels the offline machine lacks for its Python; one copy each, tag-checked.

    Example: fbench device bundle bundle/ --python 3.12"""
    from framework_bench.device import bundle as device_bundle
    try:
        m = device_bundle.build(dest, python, max_bytes=device_bundle.MAX_BYTES if max_mib is None else int(max_mib * 2**20),
                                say=lambda s: console.print(s, markup=False))
    except device_bundle.BundleError as e:
        common.fail(str(e))
    console.print(f"{dest}: {len(m.wheels)} wheels for Python {m.python}, {m.total_bytes / 2**20:.1f} MiB "
                  f"(lists: {', '.join(f'{k} {len(v)}' for k, v in m.lists.items())})", markup=False)


@device_app.command("check")
def check(
    out: Annotated[Path, typer.Option("--out",
        metavar="FOLDER", help="results.sqlite, runs.json, report.html, logs.txt, table.txt")],
    budget: Annotated[float, typer.Option("--budget",
        metavar="SECONDS", help="seconds for all runs; a run that could not finish within what is left is not "
                                "started")] = 420.0,
    device: Annotated[str, typer.Option("--device",
        metavar="DEVICE", help="cuda (the GPU check) or cpu (its rehearsal: tiny_cpu)")] = "cuda",
) -> None:
    """The one-GPU check: tiny first, then the 7B runs, bounded by the budget; --out rewritten after each run.

    Example: fbench device check --out check/ --budget 420"""
    from framework_bench.device import check as device_check
    if device not in device_check.TINY:
        common.fail(f"unknown device {device!r}: use cuda or cpu")
    from framework_bench.cli import render
    from framework_bench.present import run_lines
    from framework_bench.present.terminal_tables import results_table
    from framework_bench.scenario import scenario

    results = device_check.check(out, budget, device, say=lambda s: console.print(s, markup=False))
    render.show(results_table(render.points(results), {name: scenario.load(name) for name in {r.scenario for r in results}}))
    render.say(run_lines.reason_lines(results))
    console.print(f"every column, with the GPU's clock and power, the budget and each env's versions: {out / 'table.txt'}",
                  markup=False)
    if not any(r.status == "ok" for r in results):
        raise typer.Exit(1)


@device_app.command("estimate")
def estimate(
    budget: Annotated[float, typer.Option("--budget", metavar="SECONDS", help="seconds for all runs")] = 420.0,
    gpu: Annotated[str, typer.Option(
        "--gpu", metavar="NAME", help=f"the GPU to estimate on ({', '.join(gpus.MODELS)}; any case), "
                                      "e.g. --gpu A100-80G")] = "H200",
) -> None:
    """The check's runs and their estimated seconds on one GPU (the check's H200 unless --gpu).

    Example: fbench device estimate --gpu A100-80G --budget 600"""
    from framework_bench.device import check as device_check
    for line in device_check.dry_lines(budget, common.gpu_named(gpu)):
        typer.echo(line)
