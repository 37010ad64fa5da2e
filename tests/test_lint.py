"""Static checks of the package's shape: no module imports up the layers (import-linter, the
contract in pyproject.toml) and no dead code (vulture at 80 % confidence)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_imports_up_the_layers():
    # lint-imports is installed beside this Python by the test extra
    cli = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(cli), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Contracts: 1 kept, 0 broken." in out.stdout


def test_no_dead_code():
    out = subprocess.run([sys.executable, "-m", "vulture", "framework_bench", "tests/vulture_whitelist.py",
                          "--min-confidence", "80"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
