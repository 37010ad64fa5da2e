"""Helpers for tests that build real backend envs offline: wheels written here, no network."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_wheel(folder: Path, name: str, version: str, source: str | None = None) -> Path:
    """A minimal pure-Python wheel (one module, `source` or a VERSION line) written by hand: no
    network, no build tools."""
    folder.mkdir(parents=True, exist_ok=True)
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": source if source is not None else f"VERSION = {version!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: fbench-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
        zf.writestr(f"{dist}/RECORD", "\n".join([*(_record_line(p, t.encode()) for p, t in files.items()),
                                                 f"{dist}/RECORD,,"]) + "\n")
    return wheel


def wheel_of_installed(name: str, folder: Path) -> Path:
    """A wheel of a distribution installed in this (the host's) venv, packed from its installed
    files (its RECORD): how an offline test env gets the real numpy without a download."""
    dist = distribution(name)
    info = next(f for f in dist.files if f.name == "WHEEL" and f.parent.name.endswith(".dist-info"))
    tag = next(line.split(":", 1)[1].strip() for line in info.read_text().splitlines() if line.startswith("Tag:"))
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist.metadata['Name']}-{dist.version}-{tag}.whl"
    record_path = f"{info.parent.as_posix()}/RECORD"
    lines = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for f in dist.files:
            where = Path(dist.locate_file(f))
            # scripts (../../bin) are made again from entry points; pip's own files are not the wheel's
            if ".." in f.parts or f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json") \
                    or "__pycache__" in f.parts or not where.is_file():
                continue
            data = where.read_bytes()
            zf.writestr(f.as_posix(), data)
            lines.append(_record_line(f.as_posix(), data))
        zf.writestr(record_path, "\n".join([*lines, f"{record_path},,"]) + "\n")
    return wheel


@pytest.fixture(scope="session")
def sdk_wheels(tmp_path_factory) -> Path:
    """A folder of wheels for the worker SDK's requirements (`SDK_REQUIREMENTS`: numpy), packed
    from the host's own installs: every env `fbench env create` makes needs them."""
    from framework_bench.envs.sdk_check import SDK_REQUIREMENTS

    folder = tmp_path_factory.mktemp("sdk-wheels")
    for name in SDK_REQUIREMENTS:
        wheel_of_installed(name, folder)
    return folder
