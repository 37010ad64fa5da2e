"""Loads the suite's fixtures for every test folder: tests/ and each backend's backends/<name>/tests."""

import os
import sys
from pathlib import Path

# The shared helpers (fixtures, backend_helpers) live in tests/; a backend's tests import them too.
sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["fbench_fixtures"]

# Where the shell forbids bytecode (this machine's and CI's does), every process a test starts in
# a backend's env or the host's would compile torch, transformers, its framework and fbench from
# source each time: the suite's processes get the environment fbench's own workers get, which
# writes it beside the envs instead, never beside the sources.
from framework_bench.run.launchers.local import inherited_environ  # noqa: E402

_environ = inherited_environ()
# Widths are each test's own: a terminal's COLUMNS, or the 80 pytest-xdist sets in its workers,
# would wrap the tables the tests read.
for name in ("COLUMNS", "LINES"):
    _environ.pop(name, None)
os.environ.clear()
os.environ.update(_environ)
