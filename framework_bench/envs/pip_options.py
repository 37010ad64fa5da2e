"""How pip builds a backend's env beyond its requirements file: the options, checked, and pip's argv."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.envs.errors import EnvError
from framework_bench.envs.sdk_check import SDK_REQUIREMENTS
from framework_bench.envs.venvs import FLAVOURS


class Options(BaseModel):
    """How pip builds the env, beyond the requirements file; recorded, and a change rebuilds."""

    find_links: list[str] = Field(default_factory=list, description="wheelhouse folders (offline installs)")
    no_index: bool = False
    with_specs: list[str] = Field(default_factory=list, description="extra requirement specs or wheel paths")
    system_site_packages: bool = False
    no_deps: bool = Field(False, description="install exactly what is listed, no dependency resolution")
    torch_index: str | None = Field(None, description="extra wheel index for torch (cuda flavour)")
    requirements: str | None = Field(None, description="a requirements file replacing the flavour's own")


def validate(flavour: str | None, options: Options) -> None:
    """Everything that can be checked before an existing env is touched."""
    if flavour is not None and flavour not in FLAVOURS:
        raise EnvError(f"unknown flavour {flavour!r}: use {' or '.join(FLAVOURS)}")
    for folder in options.find_links:
        if not Path(folder).is_dir():
            raise EnvError(f"--find-links {folder}: no such folder")
    if options.requirements and not Path(options.requirements).is_file():
        raise EnvError(f"--requirements {options.requirements}: no such file")
    if any(not s.strip() for s in options.with_specs):
        raise EnvError("--with needs a requirement spec or a wheel path, not an empty string")


def pip_argv(python: Path, requirements: Path, options: Options, torch_index: str | None) -> list[str]:
    # --no-compile: pip would byte-compile every file of torch, transformers and the framework
    # (most of an env's install time on a small machine); Python compiles what a worker imports.
    argv = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-compile",
            "-r", str(requirements)]
    for folder in options.find_links:
        argv += ["--find-links", folder]
    if options.no_index:
        argv.append("--no-index")
    if options.no_deps:
        argv.append("--no-deps")
    if torch_index:
        argv += ["--extra-index-url", torch_index]
    return argv + options.with_specs + list(SDK_REQUIREMENTS)  # already satisfied: no extra cost
