"""The `fbench` command line: the typer app, assembled from one module per command group
(`scenarios`, `envs`, `runs`, `results`, `reports`, `device`), each thin over the library.
Heavy imports happen inside commands so `--help` stays fast."""

from __future__ import annotations

from typing import Annotated

import typer

from framework_bench.cli import common, envs, reports, results, runs, scenarios
from framework_bench.cli.device import device_app
from framework_bench.cli.stdout import App

app = App(no_args_is_help=True, add_completion=False,
          help="Benchmark fine-tuning frameworks on identical packed-Alpaca scenarios.\n\n"
               "Example: fbench compare --scenario tiny_cpu")


def _version(shown: bool) -> None:
    if shown:
        from framework_bench import __version__
        typer.echo(f"fbench {__version__}")
        raise typer.Exit()


@app.callback()
def _state_folder(ctx: typer.Context, version: Annotated[bool, common.Flag(
        "--version", callback=_version, is_eager=True, help="print fbench's version and exit")] = False) -> None:
    """An unusable FBENCH_HOME (not UTF-8, too long, not writable) is one line before any command."""
    from framework_bench.scenario import places
    if problem := places.state_dir_problem(writable=ctx.invoked_subcommand not in READ_ONLY):
        common.fail(problem)


READ_ONLY = {"scenarios", "show", "validate", "schema"}  # commands that never write into the state folder
# In the order `fbench --help` lists them.
app.add_typer(envs.env_app, name="env")
app.add_typer(results.results_app, name="results")
app.add_typer(device_app, name="device")
app.command()(scenarios.scenarios)
app.command()(scenarios.show)
app.command()(scenarios.validate)
app.command()(scenarios.schema)
app.command("pack")(scenarios.pack_cmd)
app.command()(envs.backends)
app.command("check-backend")(runs.check_backend)
app.command()(runs.run)
app.command()(runs.compare)
app.command()(runs.bisect)
app.command()(reports.plot)
app.command()(reports.report)
app.command()(reports.diff)
app.command()(reports.history)
