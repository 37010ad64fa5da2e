"""Loads the suite's fixtures for every test folder: tests/ and each backend's backends/<name>/tests."""

import sys
from pathlib import Path

# The shared helpers (fixtures, backend_helpers) live in tests/; a backend's tests import them too.
sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["fbench_fixtures"]


def pytest_configure(config):
    """A short temporary folder of the session's own: the xdist workers' `popen-gwN/` would lengthen
    every tmp path the CLI prints, past the width the tests read its lines and tables at."""
    import tempfile

    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="fb-")
