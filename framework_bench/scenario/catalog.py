"""Named datasets: what each holds, where its files come from, and where fbench finds them.

A scenario names its data (`dataset: {name: alpaca-enzh-demo}`). A named dataset's files are
taken from the folder `$FBENCH_DATA` when it is set, else from the copy fbench ships as package
data (`framework_bench/datasets/alpaca-demo/`, also reached as `data/alpaca-demo/` in a checkout:
the README's job runs offline, installed or not), else from fbench's user cache
(`$XDG_CACHE_HOME/fbench/datasets`, default `~/.cache/fbench/datasets`), else downloaded there
from their public home on first use. Every file is checked against its sha256, wherever it was
found: a name always means the same bytes, so the same packed stream.

Imported by `scenario.py` (for the names and `DataSource`, which a scenario's `dataset.sources`
holds too): imports nothing from the rest of fbench, anywhere in it.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

DATA_ENV = "FBENCH_DATA"
URL_ENV = "FBENCH_DATA_URL"  # overrides every download base URL (a mirror; the tests' loopback server)
DOWNLOAD_TIMEOUT_S = 60


class DataError(RuntimeError):
    """The data cannot be had or read (`framework_bench.data` raises it too)."""


@dataclass(frozen=True)
class File:
    name: str
    sha256: str


@dataclass(frozen=True)
class Named:
    description: str
    base_url: str = ""
    files: tuple[File, ...] = ()
    # hub id -> record field -> that dataset's column (sets too large to ship as files)
    hub: tuple[tuple[str, dict[str, str]], ...] = field(default_factory=tuple)
    shipped: str = ""  # the folder, under the package's `datasets/`, that holds the files


DEMO_DATA_URL = "https://raw.githubusercontent.com/hiyouga/LLaMA-Factory/main/data/"
# The data a source checkout ships (outside the package: a wheel carries none of it).
SHIPPED_DATA = Path(str(resources.files("framework_bench") / "datasets"))  # package data

DATASETS: dict[str, Named] = {
    "alpaca-enzh-demo": Named(
        "999 English + 1000 Chinese Alpaca records (LLaMA-Factory's demo files): the CPU scenarios",
        base_url=DEMO_DATA_URL, shipped="alpaca-demo",
        files=(File("alpaca_en_demo.json", "bcc37c64db1a739a0789a1b81f251146fcf4459f903474bc9e3c21bbb5628318"),
               File("alpaca_zh_demo.json", "d5a4be46ae70d23a461ffc16048069324c0865ee9aa0c8730e21ac4b65ea0f08")),
    ),
    "alpaca-enzh": Named(
        "the full sets the published rows used: tatsu-lab/alpaca (52k) + silk-road/alpaca-data-gpt4-chinese, "
        "from the hub (needs `pip install datasets` and a network)",
        hub=(("tatsu-lab/alpaca", {}),
             ("silk-road/alpaca-data-gpt4-chinese",
              {"instruction": "instruction_zh", "input": "input_zh", "output": "output_zh"})),
    ),
}
DEFAULT_DATASET = "alpaca-enzh-demo"


class DataSource(BaseModel):
    """Alpaca-format records: a local JSON file, or a hub dataset id (needs a network)."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = None
    hub: str | None = None
    split: str = "train"
    columns: dict[str, str] = Field(default_factory=dict,
                                    description="record field -> this source's column, e.g. output: output_zh")

    @model_validator(mode="after")
    def _one(self) -> "DataSource":
        if (self.path is None) == (self.hub is None):
            raise ValueError("give exactly one of path or hub")
        return self


def user_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "fbench" / "datasets"


def sources(dataset, progress: bool = True) -> list[DataSource]:
    """The `DataSource`s a scenario's `Dataset` reads: its own, or its named dataset's files
    (found or fetched as the module docstring says) or hub ids."""
    if dataset.sources is not None:
        return list(dataset.sources)
    named = DATASETS[dataset.name]
    if named.hub:
        return [DataSource(hub=hub, columns=columns) for hub, columns in named.hub]
    return [DataSource(path=str(_file(dataset.name, named, f, progress))) for f in named.files]


def _file(name: str, named: Named, f: File, progress: bool) -> Path:

    folder = os.environ.get(DATA_ENV)
    if folder:
        path = Path(folder) / f.name
        if not path.is_file():
            raise DataError(f"{DATA_ENV}={folder} lacks {f.name} (dataset {name} needs "
                            f"{', '.join(x.name for x in named.files)})")
        _check(path, f, f"{DATA_ENV}={folder}: ")
        return path
    if named.shipped and (SHIPPED_DATA / named.shipped / f.name).is_file():
        path = SHIPPED_DATA / named.shipped / f.name
        _check(path, f, "the bundled copy ")
        return path
    path = user_cache() / name / f.name
    if path.is_file():
        _check(path, f, "")
        return path
    base = os.environ.get(URL_ENV) or named.base_url
    _download(base.rstrip("/") + "/" + f.name, path, f, name, named, progress)
    return path


def _check(path: Path, f: File, where: str) -> None:

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != f.sha256:
        raise DataError(f"{where}{path} has sha256 {digest}, not the {f.sha256} of {f.name}: "
                        "a different or damaged copy; remove it (it is fetched again) or replace it")


def _download(url: str, path: Path, f: File, name: str, named: Named, progress: bool) -> None:
    """Fetch `url` into `path` atomically (a temporary file renamed into place), checking its sha256."""
    import urllib.error
    import urllib.request

    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn


    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.part{os.getpid()}-{time.monotonic_ns()}")
    h = hashlib.sha256()
    bar = Progress(TextColumn(f"downloading {f.name}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                   console=Console(stderr=True), transient=True, disable=not progress)
    try:
        with bar, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, tmp.open("wb") as out:
            size = response.headers.get("Content-Length")
            task = bar.add_task("download", total=int(size) if size and size.isascii() and size.isdigit() else None)
            while chunk := response.read(1 << 20):
                out.write(chunk)
                h.update(chunk)
                bar.advance(task, len(chunk))
        if h.hexdigest() != f.sha256:
            raise DataError(f"{url} sent a file with sha256 {h.hexdigest()}, not the expected {f.sha256}; "
                            f"{_how_to_provide(name, named)}")
        tmp.rename(path)
    except (OSError, urllib.error.URLError) as e:  # offline, refused, HTTP error, disk full
        reason = getattr(e, "reason", None) or e
        raise DataError(f"cannot download {url} ({reason}); {_how_to_provide(name, named)}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _how_to_provide(name: str, named: Named) -> str:
    return (f"set {DATA_ENV} to a folder holding {' and '.join(x.name for x in named.files)} "
            f"(dataset {name}, from {named.base_url})")
