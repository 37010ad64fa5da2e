"""benchmarks/gpu_check.sh and the device bundle: the plans and the H200 estimate (--dry), the
bundle's tag check, and the Python 3.12 bundle itself (built from the package registry: about a
minute). The real mode needs an NVIDIA GPU; its CPU rehearsal is tests/test_device_rehearsal.py."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from framework_bench.device import bundle as device_bundle
from framework_bench.device import check as device_check
from framework_bench.device.install import backend_projects

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ("tiny_cuda", "llama2_7b_8k_1gpu", "llama2_7b_32k_1gpu", "llama2_7b_8k_1gpu_zero3")
BACKENDS = ("torch", "llamafactory", "swift", "trl", "xtuner")  # the reference first, then by name (device_check.installed_backends)


def test_dry_mode_plans_every_check_and_fits_7_minutes_on_an_h200(fbench_home):
    fbench = str(Path(sys.executable).with_name("fbench"))
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}  # plans then pin GPU 0
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry"], capture_output=True, text=True,
                         env={**env, "FBENCH": fbench, "COLUMNS": "300"}, timeout=300)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for name in SCENARIOS:
        assert f"{name}: 1 node(s) x 1 cuda" in text
    for backend in BACKENDS:
        assert text.count(f"{backend} via local") == len(SCENARIOS)
    # every one-GPU plan of the frameworks starts a process group of one and pins one GPU
    assert text.count("env:  CUDA_VISIBLE_DEVICES=0") == (len(BACKENDS) - 1) * len(SCENARIOS)
    minutes = float(re.search(r"estimated on one H200: ([\d.]+) minutes", text)[1])
    assert 0 < minutes <= 7
    assert "Traceback" not in out.stderr


def test_estimate_orders_tiny_first_and_zero3_last():
    planned = device_check.plan("cuda")
    assert [p.scenario for p in planned] == [s for s in SCENARIOS for _ in BACKENDS]
    assert [p.backend for p in planned[:len(BACKENDS)]] == list(BACKENDS)
    by = {(p.scenario, p.backend): p.estimate_s for p in planned}
    # 7B runs cost their model build on top of the tiny start-up; 32k steps cost more than 8k
    assert by[("llama2_7b_32k_1gpu", "xtuner")] > by[("llama2_7b_8k_1gpu", "xtuner")] > by[("tiny_cuda", "xtuner")]
    assert [p.scenario for p in device_check.plan("cpu")] == ["tiny_cpu"] * len(BACKENDS)


def test_real_mode_refuses_without_a_bundle():
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--out", "x"], capture_output=True, text=True)
    assert out.returncode == 2 and "needs --bundle DIR and --out DIR" in out.stderr


def test_tag_check_refuses_a_wheel_for_another_python_or_platform(tmp_path):
    tags = device_bundle.target_tags("3.12")
    for ok in ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
               "tokenizers-0.22.2-cp39-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
               "multiprocess-0.70.16-py312-none-any.whl", "xtuner-0.2.0-py3-none-any.whl"):
        device_bundle.check_tags(Path(ok), tags)
    for bad in ("pydantic_core-2.50.5-cp311-cp311-manylinux_2_17_x86_64.whl",
                "pydantic_core-2.50.5-cp313-cp313-manylinux_2_17_x86_64.whl",
                "pydantic_core-2.50.5-cp312-cp312-manylinux_2_34_x86_64.whl",  # a glibc the target list does not name
                "pydantic_core-2.50.5-cp312-cp312-macosx_11_0_arm64.whl",
                "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_aarch64.whl"):
        with pytest.raises(device_bundle.BundleError, match="does not install on the target"):
            device_bundle.check_tags(Path(bad), tags)


def test_lists_pin_every_package_and_leave_out_what_the_machine_has():
    machine = {line.split("==")[0].strip().lower().replace("_", "-")
               for line in (ROOT / "benchmarks/device/h200-python312.txt").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    for name in device_bundle.list_names():
        for req in device_bundle.read_list(ROOT / f"benchmarks/device/requirements-{name}.txt"):
            # only a different version of a machine package is carried (the frameworks' pins)
            key = req.name.lower().replace("_", "-")
            assert key not in {"torch", "torchvision", "torchaudio", "triton", "numpy"}, req
    assert {"pydantic", "deepspeed", "hjson", "flash-attn"}.isdisjoint(machine)


@pytest.mark.slow  # builds the whole bundle: every wheel of the five backends' lists
def test_python312_bundle_builds_within_its_cap_for_every_bundled_backend(tmp_path):
    dest = tmp_path / "bundle"
    subprocess.run([str(Path(sys.executable).with_name("fbench")), "device", "bundle", str(dest), "--python", "3.12"],
                   check=True, timeout=900)
    manifest = device_bundle.verify(dest)
    assert manifest.total_bytes <= device_bundle.MAX_BYTES
    assert {p.name for p in backend_projects()} <= set(manifest.lists)  # every bundled backend has its list
    files = sorted(p.name for p in (dest / "wheels").iterdir())
    assert len(files) == len(manifest.wheels) == len({w.sha256 for w in manifest.wheels})  # each wheel once
    # shared wheels are stored once and named by every list that installs them
    assert manifest.lists["llamafactory"].count("transformers-5.6.0-py3-none-any.whl") == 1
    assert "transformers-5.6.0-py3-none-any.whl" in manifest.lists["torch"]
    assert [w.file for w in manifest.wheels if w.built_here] == ["deepspeed-0.18.4-py3-none-any.whl"]
    assert set(manifest.data) == {"alpaca-demo/README.md", "alpaca-demo/alpaca_en_demo.json",
                                  "alpaca-demo/alpaca_zh_demo.json"}
    assert json.loads((dest / "manifest.json").read_text())["python"] == "3.12"
    for name in device_bundle.list_names():  # what gpu_check.sh installs, by pin, --no-deps
        assert (dest / f"requirements-{name}.txt").read_text().count("==") == len(manifest.lists[name])


def test_table_txt_gives_the_share_of_torch_as_the_compare_table_does_with_the_verdicts(tmp_path):
    from framework_bench.measure.metrics import RunResult
    check = device_check.Check(tmp_path / "out", "cpu", 60.0, (), say=lambda message: None)
    s = device_check.load_scenario("tiny_cpu")
    for backend, tgs in (("torch", 200.0), ("xtuner", 150.0)):
        check.record(RunResult(backend=backend, scenario=s.name, status="ok", tgs=tgs), s)
    check.record(RunResult(backend="llamafactory", scenario=s.name, status="failed", reason="fell over"), s)
    check.store.close()
    rows = {line.split()[1]: line.split() for line in (tmp_path / "out" / "table.txt").read_text().splitlines()
            if line.startswith("tiny_cpu ")}
    assert rows["torch"][3:5] == ["200.0", "100%"] and rows["xtuner"][3:5] == ["150.0", "75%"]
    assert rows["llamafactory"][3:5] == ["-", "-"]
    assert "tiny_cpu: xtuner vs torch: 1 trial: no interval" in (tmp_path / "out" / "table.txt").read_text()
