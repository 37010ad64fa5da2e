"""What the CLI prints, pinned by golden files as a spec of its behaviour (tests/golden/golden.py:
what they hold, and how they are made independent of the machine's paths).

A difference is either a regression or a deliberate change; a deliberate one is re-captured with
`python tests/golden/golden.py --write` and named in the commit that makes it.
"""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

from fbench_fixtures import backend_env_or_skip

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import golden  # noqa: E402


@pytest.mark.slow  # starts a framework's or the host's own process
def test_cli_output_equals_the_golden_files():
    for name in golden.BACKENDS.split(","):  # a missing env would change every dry run's verdict
        backend_env_or_skip(name)
    pinned = {str(p.relative_to(golden.FILES)): p.read_text()
              for p in golden.FILES.rglob("*") if p.is_file()}
    now = golden.capture()
    assert sorted(now) == sorted(pinned), "a golden file appeared or disappeared"
    differ = []
    for key in sorted(pinned):
        if now[key] != pinned[key]:
            diff = difflib.unified_diff(pinned[key].splitlines(), now[key].splitlines(),
                                        f"golden/{key}", f"now/{key}", lineterm="", n=1)
            differ.append("\n".join(list(diff)[:40]))
    assert not differ, "\n\n".join(differ)
