"""The packed-data cache under damage and interruption: what is reused is verified, what is
damaged is packed again, nothing half-written survives, nothing starts that cannot fit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from framework_bench.worker import packed
from framework_bench.scenario import scenario
from framework_bench.data import alpaca, packing
from framework_bench.worker.packed import PackedRows


def _pack(s=None, said=None):
    return packing.pack(s or scenario.load("tiny_cpu"), progress=False,
                        say=(said.append if said is not None else lambda m: None))


@pytest.fixture
def fresh(fbench_home):
    return _pack()


def test_labels_are_part_of_the_stream_digest(fresh):
    rows = PackedRows(fresh.dir)
    labels = np.array(rows.labels)
    labels[0, -1] = packed.IGNORE_INDEX if labels[0, -1] != packed.IGNORE_INDEX else 7
    assert packed.stream_sha256(rows.input_ids, labels, rows.doc_starts) != fresh.sha256
    starts = np.array(rows.doc_starts)
    starts[1] += 1
    assert packed.stream_sha256(rows.input_ids, rows.labels, starts) != fresh.sha256


@pytest.mark.parametrize("damage", ["labels tampered", "ids truncated", "starts deleted", "manifest corrupt",
                                    "tokenizer edited"])
def test_a_damaged_cache_is_packed_again(fresh, damage):
    d = fresh.dir
    if damage == "labels tampered":  # same size: only the digest can tell
        labels = np.load(d / packed.LABELS, mmap_mode="r+")
        labels[3, 5] = 42 if labels[3, 5] != 42 else 43
        labels.flush()
        del labels
    elif damage == "ids truncated":
        with (d / packed.INPUT_IDS).open("r+b") as fh:
            fh.truncate(1000)
    elif damage == "starts deleted":
        (d / packed.DOC_STARTS).unlink()
    elif damage == "manifest corrupt":
        (d / packed.MANIFEST).write_text('{"rows": 3')
    else:
        (d / packed.TOKENIZER_DIR / "tokenizer_config.json").write_text("{}")
    said = []
    again = _pack(said=said)
    assert not again.cached and again.dir == d and again.sha256 == fresh.sha256
    assert len(said) == 1 and "damaged" in said[0]
    assert PackedRows(d).sha256() == fresh.sha256  # the repacked files are whole again
    hit = _pack()
    assert hit.cached and hit.sha256 == fresh.sha256


def test_an_intact_cache_is_reused_after_verification(fresh):
    manifest = json.loads((fresh.dir / packed.MANIFEST).read_text())
    assert set(manifest["files"]) == {packed.INPUT_IDS, packed.LABELS, packed.DOC_STARTS,
                                      "tokenizer/tokenizer.json", "tokenizer/tokenizer_config.json"}
    assert packing.verified_manifest(fresh.dir) == (manifest, None)
    assert _pack().cached


def test_vocab_size_is_part_of_the_cache_key(fresh):
    """A model whose vocabulary the byte tokenizer overflows is refused even when the same
    rows are cached for a model that fits them."""
    s = scenario.load("tiny_cpu")
    small = scenario.Scenario.model_validate({**s.model_dump(), "model": {"preset": "tiny-llama",
                                                                          "config": {"vocab_size": 200}}})
    with pytest.raises(alpaca.DataError, match="vocab_size 200"):
        _pack(small)
    bigger = scenario.Scenario.model_validate({**s.model_dump(), "model": {"preset": "tiny-llama",
                                                                           "config": {"vocab_size": 1024}}})
    other = _pack(bigger)
    assert other.dir != fresh.dir and other.sha256 == fresh.sha256  # same rows, checked for this model


def test_a_scenario_that_would_not_fit_on_the_disk_is_refused_before_writing(fbench_home):
    s = scenario.load("tiny_cpu")
    # 10^7 copies of the 1.7M-token demo stream: ~130 TB of int32 ids and labels
    huge = scenario.Scenario.model_validate({**s.model_dump(), "dataset": {**s.dataset.model_dump(),
                                                                             "repeat": 10**7}})
    with pytest.raises(alpaca.DataError, match=r"needs [\d,.]+ GiB in .* GiB free"):
        _pack(huge)
    assert not any((fbench_home / "data").iterdir())


def test_sigterm_during_packing_leaves_no_temporary_folder(fbench_home, tmp_path):
    """`fbench pack` killed with SIGTERM while writing: exit 130, the temporary folder gone."""
    big = tmp_path / "big_pack.yaml"  # 100 copies of the demo stream: ~1.3 GB, seconds to write
    big.write_text(scenario.SCENARIO_DIR.joinpath("tiny_cpu.yaml").read_text()
                   .replace("dataset:\n", "dataset:\n  repeat: 100\n"))
    proc = subprocess.Popen([sys.executable, "-c", "from framework_bench.cli import app; app()", "pack", str(big)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    data = fbench_home / "data"
    while not (data.is_dir() and any(".tmp-" in p.name for p in data.iterdir())):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "packing never started writing"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert list(data.iterdir()) == []


def test_leftovers_of_a_killed_packer_are_swept(fbench_home):
    data = fbench_home / "data"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    import socket
    leftover = data / f"abc.tmp-{socket.gethostname()}-{dead}-123"
    live = data / f"abd.tmp-{socket.gethostname()}-{os.getpid()}-456"  # a packer still at work
    for d in (leftover, live):
        d.mkdir(parents=True)
        (d / "input_ids.npy").write_bytes(b"x" * 100)
    _pack()
    assert not leftover.exists() and live.exists()
