"""Install fbench on an offline machine from a bundle (`fbench device bundle`) and the checkout.

    python3 -m framework_bench.device.install --bundle DIR --work WORK

Run by benchmarks/gpu_check.sh with the machine's own python3 and PYTHONPATH=<checkout>, before
pydantic is there: standard library only. It makes WORK/host, a venv layered over that python3
(its torch, typer, matplotlib... behind the venv's own; see site_layers), installs the host's
missing wheels from the bundle into it, then fbench and the bundled backends editable from the
checkout. Never the network, an index or the user's pip configuration: pip runs with
`--no-index`, PIP_CONFIG_FILE=/dev/null and no PIP_* variable.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from framework_bench.envs import site_layers

ROOT = Path(__file__).resolve().parents[2]


def offline_pip_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment without the user's pip settings: PIP_FIND_LINKS, say, is honoured even
    with --no-index, and a config file can add indexes and constraints."""
    environ = dict(os.environ if environ is None else environ)
    return {**{k: v for k, v in environ.items() if not k.startswith("PIP_")}, "PIP_CONFIG_FILE": os.devnull}


def backend_projects(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in (root / "backends").glob("*/pyproject.toml"))


def install(bundle: Path, work: Path, root: Path = ROOT) -> Path:
    """Make WORK/host and return its Python (its `fbench` beside it)."""
    python_version = json.loads((bundle / "manifest.json").read_text())["python"]
    if python_version != "%d.%d" % sys.version_info[:2]:
        raise SystemExit(f"the bundle {bundle} is for Python {python_version}; this is {sys.version.split()[0]} "
                         f"({sys.executable}): build one with `fbench device bundle DIR --python "
                         f"{sys.version_info[0]}.{sys.version_info[1]}`")
    host = work / "host"
    if host.exists():
        shutil.rmtree(host)  # seconds to remake; never a half-updated layer
    work.mkdir(parents=True, exist_ok=True)
    inherited = site_layers.make_layer(host)
    print(f"host venv {host} over {sys.executable} (inherits {len(inherited)} folders)", flush=True)
    python = host / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "--no-index", "--no-deps", "--no-input", "--disable-pip-version-check",
           "--no-compile", "-q"]
    env = offline_pip_env()
    subprocess.run(pip + ["--find-links", str(bundle / "wheels"), "-r", str(bundle / "requirements-host.txt")],
                   check=True, env=env)
    editable = [arg for project in [root, *backend_projects(root)] for arg in ("-e", str(project))]
    subprocess.run(pip + ["--no-build-isolation", *editable], check=True, env=env)
    subprocess.run([str(host / "bin" / "fbench"), "--help"], check=True, env=env, stdout=subprocess.DEVNULL)
    return python


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    args = parser.parse_args(argv)
    print(install(args.bundle.resolve(), args.work.resolve()))


if __name__ == "__main__":
    main()
