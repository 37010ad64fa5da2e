"""`fbench scenarios`, `show`, `validate`, `schema`, `pack`: the scenarios and their packed data."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from framework_bench.cli import common, render


def scenarios(wide: common.WideOption = False) -> None:
    """List the scenarios in scenarios/.

    Example: fbench scenarios --wide"""
    from framework_bench.present.terminal_tables import scenarios_table
    render.show(scenarios_table(wide))


def show(
    name: Annotated[Optional[str], typer.Argument(metavar="NAME", help="scenario name or file (or --scenario)")] = None,
    scenario: Annotated[Optional[str], typer.Option(
        "--scenario", metavar="NAME",
        help="scenario name or file, as compare takes it, e.g. --scenario llama2_7b_32k_1gpu")] = None,
    as_json: Annotated[bool, common.Flag("--json", help="one JSON object")] = False,
    gpu: common.GpuOption = None,
) -> None:
    """Show a validated scenario with its FLOPs per token by both formulas; with --gpu, whether it fits on that GPU.

    Example: fbench show llama2_7b_32k_1gpu --gpu A100-80G"""
    if (name is None) == (scenario is None):
        common.fail("give the scenario once: `fbench show NAME` or `fbench show --scenario NAME`")
    from framework_bench.present.scenario_summary import scenario_lines, scenario_summary
    s = common.load_scenario(name if name is not None else scenario)
    gpu = common.gpu_named(gpu)
    info = scenario_summary(s, gpu)
    if as_json:
        print(json.dumps({**info, "memory": info["memory"].model_dump()}, indent=2))
        return
    render.say(scenario_lines(s, info, gpu))


def validate(files: Annotated[list[Path], typer.Argument(metavar="FILE", help="scenario files, one or more")]) -> None:
    """Validate scenario files; exit 1 listing each bad field.

    Example: fbench validate scenarios/tiny_cpu.yaml"""
    from framework_bench.scenario import scenario
    bad = 0
    for f in files:
        try:
            scenario.load_file(f)
            common.console.print(f"[green]ok[/green] {escape(str(f))}", highlight=False)
        except scenario.ScenarioError as e:
            bad += 1
            for line in str(e).splitlines():
                common.err.print(f"[red]error:[/red] {escape(line)}", highlight=False, soft_wrap=True)
    if bad:
        raise typer.Exit(1)


def schema() -> None:
    """Print the JSON schema of a scenario file.

    Example: fbench schema > scenario.schema.json"""
    from framework_bench.scenario.scenario import Scenario
    print(json.dumps(Scenario.model_json_schema(), indent=2))


def pack_cmd(name: Annotated[str, typer.Argument(metavar="NAME", help="scenario name or file")]) -> None:
    """Build (or reuse) the packed data of a scenario; print rows, tokens, documents, sha256.

    Example: fbench pack tiny_cpu_4k"""
    from framework_bench.data.packing import pack
    from framework_bench.run.interrupts import stop_signals_interrupt
    s = common.load_scenario(name)
    try:
        with stop_signals_interrupt():
            data = pack(s, say=lambda msg: common.console.print(f"[yellow]{escape(msg)}[/yellow]", highlight=False))
    except common.user_errors() as e:
        common.fail(str(e))
    except KeyboardInterrupt:
        common.err.print("[yellow]interrupted: nothing was kept of the unfinished packing[/yellow]")
        raise typer.Exit(common.EXIT_INTERRUPTED)
    m = data.manifest
    common.console.print(f"{'reused' if data.cached else 'packed'} {data.dir}", highlight=False, markup=False)
    common.console.print(f"rows {m['rows']:,} x {m['context_length']:,} = {m['tokens']:,} tokens, "
                  f"{m['documents']:,} documents (dataset repeated {m['repeat']}x), {m['seconds']:.2f} s to pack")
    common.console.print(f"sha256 {m['sha256']}")

