"""`fbench backends` and `fbench env ...`: the installed backends and their own environments."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from framework_bench.cli import common

env_app = common.Typer(no_args_is_help=True, help="Each backend's own virtual environment.\n\n"
                                                  "Example: fbench env create torch --flavour cpu")


def backends() -> None:
    """List the installed backends, their environments and capabilities.

    Example: fbench backends"""
    from framework_bench.present.terminal_tables import backends_table
    common.console.print(backends_table())


@env_app.command("create")
def env_create(
    names: Annotated[Optional[list[str]], typer.Argument(metavar="BACKEND", help=(
        "backends (default: all); one at a version as NAME@VERSION or NAME@DIST==VERSION"))] = None,
    flavour: Annotated[Optional[str], typer.Option("--flavour",
        metavar="FLAVOUR", help="cpu or cuda (default: cuda if nvidia-smi works)")] = None,
    find_links: Annotated[Optional[list[str]], typer.Option(
        "--find-links", metavar="FOLDER", help="a wheelhouse folder (repeatable)")] = None,
    no_index: Annotated[bool, common.Flag(
        "--no-index", help="install only from --find-links folders (offline)")] = False,
    with_specs: Annotated[Optional[list[str]], typer.Option(
        "--with", metavar="PACKAGE", help="an extra package: spec or wheel path (repeatable)")] = None,
    system_site_packages: Annotated[bool, common.Flag(
        "--system-site-packages", help="reuse the machine's installed packages (its torch, flash-attn)")] = False,
    no_deps: Annotated[bool, common.Flag(
        "--no-deps", help="install exactly what is listed, without dependency resolution")] = False,
    torch_index: Annotated[Optional[str], typer.Option(
        "--torch-index", metavar="URL",
        help="torch wheel index URL (default: chosen from the driver's CUDA version)")] = None,
    requirements: Annotated[Optional[str], typer.Option(
        "--requirements", metavar="FILE", help="a requirements file replacing the backend's own")] = None,
) -> None:
    """Create (or reuse) backend environments; idempotent. Built aside and swapped in only when complete.

    Example: fbench env create xtuner torch --flavour cpu"""
    from framework_bench.envs.creation import create_backend
    from framework_bench.envs.errors import EnvError
    from framework_bench.envs.pip_options import Options, validate
    from framework_bench.plugins import registry as plugins
    options = Options(find_links=[str(Path(f).resolve()) for f in find_links or []], no_index=no_index,
                      with_specs=list(with_specs or []), system_site_packages=system_site_packages,
                      no_deps=no_deps, torch_index=torch_index,
                      requirements=str(Path(requirements).resolve()) if requirements else None)
    try:
        found = {n: plugins.get(n) for n in map(common.backend_spec, names)} if names else plugins.backends()
    except plugins.UnknownBackend as e:
        common.fail(str(e))
    from framework_bench.run.interrupts import stop_signals_interrupt
    try:
        validate(flavour, options)
        with stop_signals_interrupt():  # SIGTERM too: the half-built env and pip go, not only on Ctrl-C
            for backend in found.values():
                create_backend(backend, flavour, say=lambda m: common.console.print(m, highlight=False, markup=False),
                               options=options)
    except EnvError as e:
        common.fail(str(e))
    except KeyboardInterrupt:
        common.err.print("[yellow]interrupted: the half-built env was removed; an earlier env stays as it was[/yellow]")
        raise typer.Exit(common.EXIT_INTERRUPTED)


@env_app.command("list")
def env_list() -> None:
    """Show each backend env: path, flavour, framework/torch/transformers versions, state.

    Example: fbench env list"""
    from framework_bench.present.terminal_tables import envs_table
    common.console.print(envs_table())
