"""The suite's shared fixtures, for tests/ and for each backend's own tests (backends/<name>/tests); loaded by the root conftest.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# A multi-process run's limit in the tests: the slowest (XTuner's ZeRO on two CPU processes)
# took 42 s under CI; a hang (once, DDP over gloo) then costs minutes, not a quarter of an hour.
MULTIPROCESS_TIMEOUT = 300

# Throwaway backends (tests/fake_backends) whose worker trains nothing: the host's bookkeeping.
FAKES = Path(__file__).parent / "fake_backends"

# The Alpaca files of the dataset `alpaca-enzh-demo` the CPU scenarios pack: the copies the
# repository ships in data/alpaca-demo (FBENCH_DATA, unless the caller set it already), so the
# tests never download them.
ALPACA_DIR = Path(os.environ.get("FBENCH_DATA") or Path(__file__).resolve().parents[1] / "data/alpaca-demo")


@pytest.fixture(autouse=True, scope="session")
def fbench_data():
    """FBENCH_DATA for the whole session (a test that needs it unset uses monkeypatch.delenv)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FBENCH_DATA", str(ALPACA_DIR))
        yield ALPACA_DIR


@pytest.fixture
def fbench_home(tmp_path, monkeypatch) -> Path:
    """A private FBENCH_HOME, so a test never writes into the repo's .fbench or ../shared."""
    home = tmp_path / "fbench_home"
    monkeypatch.setenv("FBENCH_HOME", str(home))
    return home


@pytest.fixture
def home_with_envs(tmp_path, monkeypatch) -> Path:
    """A private FBENCH_HOME whose envs are the ones setup made (a link to them): a test's runs,
    plans and packed data go to its own folder, the backends' envs are not built again."""
    from framework_bench.envs import venvs as envs

    real_envs = (envs.fbench_home() / "envs").resolve()
    home = tmp_path / "home"
    home.mkdir()
    (home / "envs").symlink_to(real_envs)
    monkeypatch.setenv("FBENCH_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def alpaca_dir() -> Path:
    assert (ALPACA_DIR / "alpaca_en_demo.json").is_file(), f"Alpaca demo data missing at {ALPACA_DIR}"
    return ALPACA_DIR


def ctrl_c_reaches_it() -> None:
    """In a host's child before exec (`preexec_fn`): Ctrl-C at a terminal is never ignored, but a
    shell that starts the tests in the background ignores SIGINT, and an ignored signal stays
    ignored across exec (Python then installs no KeyboardInterrupt handler): the host would
    never hear it, and wait for its worker forever."""
    import signal
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def processes_mentioning(text: str) -> list[int]:
    """Live (not zombie) processes whose command line holds `text` (a worker's job file lies
    under FBENCH_HOME), this one excepted."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = next((l for l in (entry / "status").read_text().splitlines() if l.startswith("State:")), "")
        except OSError:
            continue
        if text in cmdline and "zombie" not in state:
            found.append(int(entry.name))
    return found


def end_processes_mentioning(text: str | Path) -> None:
    """SIGKILL what `processes_mentioning(text)` finds: a test's leftovers."""
    import signal

    for pid in processes_mentioning(str(text)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def backend_env_or_skip(name: str):
    """The ready env of backend `name`. Missing: skipped on a developer machine, but a
    failure under CI, whose setup creates every env (a skip must never pass as a result)."""
    import os

    from framework_bench.envs import venvs as envs
    from framework_bench.plugins import registry as plugins

    env = envs.inspect(name, plugins.get(name).info.env)
    if not env.ready:
        message = f"{name} env {env.problem}; `fbench env create {name}` makes it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return env


@pytest.fixture(scope="session")
def tiny_cpu_packed(tmp_path_factory) -> Path:
    """`tiny_cpu` packed once for the session, in a state folder of its own: the packed-data
    folder the homes of the fake backends' tests start with (`with_tiny_cpu_packed`). Packing it
    is no part of what they check, and cost each of them half a second; the packing tests pack."""
    from framework_bench.data.packing import pack
    from framework_bench.scenario import scenario

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FBENCH_HOME", str(tmp_path_factory.mktemp("packed-home")))
        return pack(scenario.load("tiny_cpu"), progress=False, say=lambda msg: None).dir


def with_tiny_cpu_packed(home: Path, packed: Path) -> None:
    """A copy (a test may damage its own) of the session's packed `tiny_cpu` in `home`'s cache,
    where `pack` finds it, verifies it and reuses it."""
    shutil.copytree(packed, home / "data" / packed.name)


@pytest.fixture
def fakes(tmp_path, monkeypatch, fbench_home, tiny_cpu_packed):
    """The fake backends, installed for this test through a dist-info entry point like any
    third-party plugin; their modules importable in the test and in the processes it starts."""
    with_tiny_cpu_packed(fbench_home, tiny_cpu_packed)
    monkeypatch.syspath_prepend(str(FAKES))
    import fbench_fake_backends

    site = tmp_path / "site"
    fbench_fake_backends.register_through_entry_points(site)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKES), str(site), os.environ.get("PYTHONPATH", "")]))
    # fake_ok stands in as the reference that judges the fakes' runs (their losses and update agree
    # by construction), in this process and in the fbench processes a test starts
    monkeypatch.setenv("FBENCH_REFERENCE", "fake_ok")
    # what the fakes show is the host's logic, not this machine's load: the `machine` check (a run
    # beside other work marked disturbed) is tested on its own stamps (tests/test_machine_load.py)
    monkeypatch.setenv("FBENCH_UNCHECKED", "machine")
    return fbench_fake_backends


# Third-party backends that lie (tests/lying_backends): the torch worker with one lie each.
LIARS = Path(__file__).parent / "lying_backends"


@pytest.fixture(scope="module")
def liars(tmp_path_factory):
    """The lying backends, installed for this module through a dist-info entry point like any
    third-party plugin. They run in the torch env (the real FBENCH_HOME's): skipped without
    it on a developer machine, failed under CI."""
    backend_env_or_skip("torch")
    site = tmp_path_factory.mktemp("lying-site")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(LIARS))
        import fbench_lying_backends

        fbench_lying_backends.register_through_entry_points(site)
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(LIARS), str(site), os.environ.get("PYTHONPATH", "")]))
        yield fbench_lying_backends


@pytest.fixture(scope="session")
def tiny_cpu_run(tmp_path_factory):
    """`tiny_cpu_run(backend)`: the backend's real run of `tiny_cpu` (matched settings, the default
    seed), made on first use and shared by every test of the session that reads one — the
    reference a parity test judges against, a backend's own checks of its run. The runs are
    the same whichever test asks first, so a real trainer runs once per backend, not once per
    test. Tests read a shared result, never change it."""
    from backend_helpers import CPU

    from framework_bench.data.packing import pack
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.scenario import scenario

    scn = scenario.load("tiny_cpu")
    root = tmp_path_factory.mktemp("tiny-cpu-runs")
    done: dict = {}

    def run(backend: str):
        if backend not in done:
            backend_env_or_skip(backend)
            data = pack(scn, progress=False, say=lambda msg: None)
            done[backend] = (scn, data, pipeline.run_one(backend, scn, RunOptions(root=root), data=data, machine=CPU))
        return done[backend]

    return run


@pytest.fixture(scope="session")
def torch_zero_run():
    """`torch_zero_run(stage, loss_scheme=None)`: the torch reference's run of
    `multiproc_tiny_cpu_zero{stage}` (FSDP2 over two CPU processes through torchrun, the
    launcher a two-process scenario gets by default) with that loss normalisation, made on
    first use and shared by the session: the reference the frameworks' ZeRO runs are judged
    against (tests/test_zero_cpu.py, one host process: the same projection vector as theirs)
    and the torch backend's own ZeRO-3 run (backends/torch/tests). Tests read a shared result,
    never change it."""
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.scenario import scenario

    runs: dict = {}

    def run(stage: int, loss_scheme: str | None = None):
        if (stage, loss_scheme) not in runs:
            backend_env_or_skip("torch")
            runs[stage, loss_scheme] = pipeline.run_one("torch", scenario.load(f"multiproc_tiny_cpu_zero{stage}"),
                                                        RunOptions(launcher="torchrun", timeout=MULTIPROCESS_TIMEOUT,
                                                                   loss_scheme=loss_scheme))
        return runs[stage, loss_scheme]

    return run
