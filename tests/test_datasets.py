"""Named datasets on a fresh machine: FBENCH_DATA, the user cache, a download from a loopback
HTTP server (127.0.0.1 only), checksums, and the one-line answer when nothing can be had."""

from __future__ import annotations

import functools
import hashlib
import http.server
import re
import shutil
import threading

import pytest
from typer.testing import CliRunner

from framework_bench.scenario import scenario
from framework_bench.cli import app
from framework_bench.data import alpaca, packing
from framework_bench.scenario import catalog
from framework_bench.scenario.scenario import PROJECT_ROOT

FILES = ("alpaca_en_demo.json", "alpaca_zh_demo.json")
SHIPPED = catalog.SHIPPED_DATA  # the demo files fbench ships (package data)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # the request log would land in the CLI's captured stderr
        pass


@pytest.fixture
def served(tmp_path, fbench_data):
    """The demo files served over HTTP from a folder (tests may damage the copies), on 127.0.0.1."""
    root = tmp_path / "www"
    root.mkdir()
    for name in FILES:
        shutil.copy(fbench_data / name, root / name)
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_data(tmp_path, monkeypatch, fbench_home):
    """A fresh machine and an fbench without its shipped copy: no FBENCH_DATA, an empty user cache."""
    monkeypatch.delenv(catalog.DATA_ENV, raising=False)
    monkeypatch.setattr(catalog, "SHIPPED_DATA", tmp_path / "no-checkout")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fbench" / "datasets"


def _pack(name: str = "tiny_cpu") -> str:
    result = CliRunner().invoke(app, ["pack", name])
    assert result.exit_code == 0, result.output
    return re.search(r"sha256 ([0-9a-f]{64})", result.output).group(1)


def test_catalog_checksums_are_those_of_the_demo_files(fbench_data):
    for f in catalog.DATASETS["alpaca-enzh-demo"].files:
        assert hashlib.sha256((fbench_data / f.name).read_bytes()).hexdigest() == f.sha256


def test_download_on_first_use_then_the_cache_gives_the_same_stream(served, no_data, monkeypatch, fbench_home):
    www, url = served
    monkeypatch.setenv(catalog.URL_ENV, url)
    downloaded = _pack()
    assert sorted(p.name for p in (no_data / "alpaca-enzh-demo").iterdir()) == sorted(FILES)  # no .part left
    # the server is not asked again: the cached copies serve
    for name in FILES:
        (www / name).unlink()
    shutil.rmtree(fbench_home / "data")
    assert _pack() == downloaded
    # and FBENCH_DATA (CI's way) packs the very same bytes into the very same stream
    monkeypatch.setenv(catalog.DATA_ENV, str(no_data / "alpaca-enzh-demo"))
    shutil.rmtree(fbench_home / "data")
    assert _pack() == downloaded


def test_a_download_with_the_wrong_checksum_is_refused_and_not_kept(served, no_data, monkeypatch):
    www, url = served
    (www / "alpaca_zh_demo.json").write_bytes(b'[{"instruction": "x", "input": "", "output": "tampered"}]')
    monkeypatch.setenv(catalog.URL_ENV, url)
    result = CliRunner().invoke(app, ["pack", "tiny_cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "alpaca_zh_demo.json" in lines[0] and "sha256" in lines[0]
    assert not (no_data / "alpaca-enzh-demo" / "alpaca_zh_demo.json").exists()
    assert not [p for p in (no_data / "alpaca-enzh-demo").iterdir() if ".part" in p.name]


def test_offline_without_fbench_data_says_how_to_provide_it(no_data, monkeypatch):
    # a port nobody listens on: as offline as a machine gets, without touching the network
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv(catalog.URL_ENV, f"http://127.0.0.1:{port}/")
    result = CliRunner().invoke(app, ["pack", "tiny_cpu"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert "FBENCH_DATA" in lines[0] and "alpaca_en_demo.json" in lines[0] and "alpaca_zh_demo.json" in lines[0]


def test_a_checkout_packs_offline_from_its_own_copy_the_same_stream(no_data, monkeypatch, fbench_home, fbench_data):
    """The README's job on a machine without network: no FBENCH_DATA, an empty cache, no server;
    a source checkout reads the demo files it ships, and they pack the stream FBENCH_DATA gives."""
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv(catalog.URL_ENV, f"http://127.0.0.1:{s.getsockname()[1]}/")
    monkeypatch.setattr(catalog, "SHIPPED_DATA", SHIPPED)
    shipped = _pack()
    assert not no_data.exists()  # nothing downloaded, nothing cached
    monkeypatch.setenv(catalog.DATA_ENV, str(fbench_data))
    shutil.rmtree(fbench_home / "data")
    assert _pack() == shipped


def test_a_damaged_checkout_copy_is_refused(tmp_path, no_data, monkeypatch):
    (tmp_path / "no-checkout" / "alpaca-demo").mkdir(parents=True)
    for name in FILES:
        (tmp_path / "no-checkout" / "alpaca-demo" / name).write_text("[]")
    with pytest.raises(alpaca.DataError, match="bundled copy .*alpaca_en_demo.json has sha256"):
        packing.pack(scenario.load("tiny_cpu"), progress=False, say=lambda m: None)


def test_fbench_data_without_the_files_names_what_is_missing(tmp_path, monkeypatch, fbench_home):
    monkeypatch.setenv(catalog.DATA_ENV, str(tmp_path))
    result = CliRunner().invoke(app, ["pack", "tiny_cpu"])
    assert result.exit_code == 1
    assert "FBENCH_DATA" in result.stderr and "lacks alpaca_en_demo.json" in result.stderr


def test_a_different_file_in_fbench_data_is_refused(tmp_path, monkeypatch, fbench_home, fbench_data):
    for name in FILES:
        shutil.copy(fbench_data / name, tmp_path / name)
    (tmp_path / "alpaca_en_demo.json").write_text("[]")
    monkeypatch.setenv(catalog.DATA_ENV, str(tmp_path))
    with pytest.raises(alpaca.DataError, match="alpaca_en_demo.json has sha256"):
        packing.pack(scenario.load("tiny_cpu"), progress=False, say=lambda m: None)


def test_named_dataset_and_explicit_paths_pack_the_same_stream(fbench_home, fbench_data):
    named = scenario.load("tiny_cpu")
    explicit = scenario.Scenario.model_validate({
        **named.model_dump(exclude={"dataset"}),
        "dataset": {"sources": [{"path": str(fbench_data / f)} for f in FILES]}})
    a = packing.pack(named, progress=False, say=lambda m: None)
    b = packing.pack(explicit, progress=False, say=lambda m: None)
    assert a.sha256 == b.sha256 and a.dir == b.dir and b.cached
    assert a.manifest["dataset"] == "alpaca-enzh-demo"


def test_the_published_sets_are_read_from_the_hub_with_the_chinese_columns():
    s = scenario.load("tiny_cpu")
    full = s.dataset.model_copy(update={"name": "alpaca-enzh"})
    srcs = catalog.sources(full)
    assert [x.hub for x in srcs] == ["tatsu-lab/alpaca", "silk-road/alpaca-data-gpt4-chinese"]
    assert srcs[1].columns == {"instruction": "instruction_zh", "input": "input_zh", "output": "output_zh"}


def test_dataset_names_are_checked_and_exclusive_with_sources():
    base = {"name": "x", "model": {"preset": "tiny-llama"}, "context_length": 512}
    with pytest.raises(Exception, match="unknown dataset 'nope'"):
        scenario.Scenario.model_validate({**base, "dataset": {"name": "nope"}})
    with pytest.raises(Exception, match="not both"):
        scenario.Scenario.model_validate({**base, "dataset": {"name": "alpaca-enzh", "sources": [{"path": "a"}]}})
    assert scenario.Scenario.model_validate(base).dataset.name == catalog.DEFAULT_DATASET


def test_nothing_in_the_project_reads_the_sibling_shared_folder():
    offenders = [str(p.relative_to(PROJECT_ROOT)) for folder in ("scenarios", "framework_bench", "backends")
                 for p in (PROJECT_ROOT / folder).rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".txt", ".toml")
                 and "../shared" in p.read_text(errors="replace")]
    assert offenders == []
