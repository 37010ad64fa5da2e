"""Loads the suite's fixtures for every test folder: tests/ and each backend's backends/<name>/tests."""

import sys
from pathlib import Path

# The shared helpers (fixtures, backend_helpers) live in tests/; a backend's tests import them too.
sys.path.insert(0, str(Path(__file__).parent / "tests"))

pytest_plugins = ["fbench_fixtures"]
