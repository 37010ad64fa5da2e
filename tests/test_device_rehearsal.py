"""The GPU machine's install-and-run path, rehearsed offline on this CPU machine (minutes).

A stand-in for that machine's python3: a venv with CPU torch and, of the packages it holds
(benchmarks/device/h200-python312.txt), those the path imports (benchmarks/device/standin-cpu.txt),
without pydantic, deepspeed, hjson or flash-attn. A bundle is built for this machine's Python,
then from a copy of the checkout with no .venv, no .fbench and no ../shared, `gpu_check.sh
--bundle --out` runs under `unshare -n` (no network at all) with no PIP_* variable and
PIP_CONFIG_FILE=/dev/null: host install, one env per backend over the stand-in's torch, tiny_cpu
for each of the five bundled backends. The stand-in's site-packages must come out byte for byte as
they went in. Only CUDA is then left unproven.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from framework_bench.device.check import OUT_FILES

ROOT = Path(__file__).resolve().parents[1]
ABSENT = ("pydantic", "deepspeed", "hjson", "flash_attn")
BACKENDS = ("torch", "xtuner", "llamafactory", "trl", "swift")
pytestmark = pytest.mark.slow


def make_standin(path: Path) -> Path:
    """The stand-in venv. Its torchvision/torchaudio are PyPI's CUDA builds (the only ones beside
    torch 2.13 here): made importable on CPU with the backends' own fixups, as the machine's
    CUDA builds import there. Built online, before anything offline starts."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", "-r",
                    str(ROOT / "benchmarks/device/standin-cpu.txt")],
                   check=True)
    fix = ("from fbench_xtuner.env_fixups import guard_torchvision_fake_ops as g; print(g()); "
           "from fbench_llamafactory.env_fixups import disable_torchaudio_libs as d; d(); import torchvision, torchaudio")
    subprocess.run([str(python), "-c", fix], check=True,
                   env={**os.environ, "PYTHONPATH": f"{ROOT / 'backends/xtuner'}:{ROOT / 'backends/llamafactory'}"})
    return python


def site_hash(python: Path) -> str:
    """Every file under the stand-in's site-packages: path, mode and content."""
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    h = hashlib.sha256()
    for f in sorted(p for p in site.rglob("*") if p.is_file() or p.is_symlink()):
        h.update(f"{f.relative_to(site)}\0{f.lstat().st_mode}\0".encode())
        if f.is_file() and not f.is_symlink():
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()


def copy_checkout(dest: Path) -> Path:
    """The tracked files only (no .venv, .fbench or anything ignored); ../shared is not beside it."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def test_install_and_run_offline_from_the_bundle(tmp_path):
    # The bundle, for the stand-in's Python (this one's, which makes it), built while the stand-in is made
    bundle = tmp_path / "bundle"
    bundling = subprocess.Popen([str(Path(sys.executable).with_name("fbench")), "device", "bundle", str(bundle),
                                 "--python", "%d.%d" % sys.version_info[:2]])
    python = make_standin(tmp_path / "standin")
    assert bundling.wait(timeout=600) == 0
    for module in ABSENT:
        found = subprocess.run([str(python), "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is not None)"],
                               capture_output=True, text=True, check=True).stdout.strip()
        assert found == "False", f"the stand-in must not hold {module}"
    before = site_hash(python)
    checkout = copy_checkout(tmp_path / "checkout")
    assert not (checkout / ".venv").exists() and not (checkout / ".fbench").exists()
    assert not (checkout.parent / "shared").exists()

    out, work = tmp_path / "out", tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "FBENCH_", "VIRTUAL_ENV"))}
    env.update(PIP_CONFIG_FILE=os.devnull, FBENCH_PYTHON=str(python), PATH=os.defpath)
    started = time.monotonic()
    proc = subprocess.run(["unshare", "-n", "bash", str(checkout / "benchmarks/gpu_check.sh"), "--bundle", str(bundle),
                           "--out", str(out), "--work", str(work), "--budget", "1200"],
                          env=env, capture_output=True, text=True, timeout=1500)
    seconds = time.monotonic() - started
    table = (out / "table.txt").read_text() if (out / "table.txt").exists() else ""
    # the table's wall times are benchmarks/device/rehearsal-startup.json's observations
    print(proc.stdout[-6000:], proc.stderr[-6000:], table, f"offline install and runs: {seconds:.0f} s", sep="\n")
    assert proc.returncode == 0, proc.stderr[-4000:]

    assert sorted(p.name for p in out.iterdir()) == sorted(OUT_FILES)
    runs = json.loads((out / "runs.json").read_text())
    assert {(r["backend"], r["scenario"], r["status"]) for r in runs} == {(b, "tiny_cpu", "ok") for b in BACKENDS}
    # judged in their round against the reference's run beside them, as a compare judges them
    for r in runs:
        if r["backend"] != "torch":
            passed = {c["name"] for c in r["checks"] if c["status"] == "pass"}
            assert {"parity", "update_parity"} <= passed, (r["backend"], r["checks"])
    for b in BACKENDS:
        assert re.search(rf"^tiny_cpu\s+{b}\s+ok\s", table, re.M), table
    assert "data:image" in (out / "report.html").read_text()  # charts inlined
    assert "===== tiny_cpu / xtuner: ok" in (out / "logs.txt").read_text()
    # the envs run over the stand-in's torch and the bundle's frameworks, installed in the work folder
    for b in BACKENDS:
        record = json.loads((work / "home/envs" / b / "fbench-env.json").read_text())
        assert record["versions"].get("torch") is None, f"{b}: torch must come from the stand-in, not the bundle"
        assert any(str(tmp_path / "standin") in d for d in record["site_dirs"])
    assert site_hash(python) == before, "the run changed the stand-in's site-packages"
