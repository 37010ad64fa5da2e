"""Claims required by contract: a plugin declares, as a number, the contract it was written
against; at the current one a claim not made makes the run `invalid` (the claimless fake:
tests/test_host_clock.py), at contract 1 the run still goes, `unverified`, kept out of "% of
reference" and of the charts unless asked. The window: the contracts this release runs, the
release that drops the oldest, and a plugin outside them refused before any run."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import framework_bench
from backend_helpers import CPU, contributing_backend
from framework_bench.cli import app
from framework_bench.plugins import contract
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import CONTRACT, BackendInfo, Capabilities, EnvSpec
from framework_bench.present.verdict import Points

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ("torch", "xtuner", "llamafactory", "trl", "swift")
BASE = dict(name="x", framework="x",
            capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
            env=EnvSpec(requirements={}, framework_package="x"))


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def test_a_plugin_declaring_no_contract_is_of_contract_1_and_one_naming_the_hosts_constant_of_2():
    """`contract=CONTRACT` names the host's contract, whatever the release: it is read as the first
    contract the name stood for, never raised by the host's next release."""
    assert BackendInfo(**BASE).contract == 1 and CONTRACT == 5
    assert BackendInfo(**BASE, contract=CONTRACT).contract == contract.CONTRACT_NAMED_FROM == 2
    assert BackendInfo(**BASE, contract=4).contract == 4 and BackendInfo(**BASE, contract=3).contract == 3


def test_the_bundled_backends_and_contributings_example_declare_the_current_contract_as_a_number():
    for name in BUNDLED:
        assert plugins.get(name).info.contract == CONTRACT, name
    for source in [*ROOT.glob("backends/*/fbench_*/plugin.py")]:
        assert re.findall(r"\bcontract=(\w+)", source.read_text()) == [str(CONTRACT)], source
    assert re.findall(r"\bcontract=(\w+)", contributing_backend()[1]) == [str(CONTRACT)]


def test_this_release_runs_its_predecessors_contracts_and_names_the_release_dropping_the_oldest():
    """The window's end: once the version reaches OLDEST_DROPPED_IN, the oldest contract goes (the
    fakes of contract 1 move on), and the next oldest gets its own release, a release ahead."""
    assert _release(framework_bench.__version__) < _release(contract.OLDEST_DROPPED_IN), (
        f"fbench {framework_bench.__version__} still runs plugin contract {contract.OLDEST_CONTRACT}, "
        f"which {contract.OLDEST_DROPPED_IN} drops")
    assert contract.OLDEST_CONTRACT <= CONTRACT - 1  # a plugin of the previous release keeps running


def test_contributing_states_the_window_this_release_runs():
    text = " ".join((ROOT / "CONTRIBUTING.md").read_text().split())
    assert f"fbench {framework_bench.__version__} runs {contract.window()}." in text
    assert contract.window() == f"plugin contracts 1 to {CONTRACT}, contract 1 until 0.4.0"


PLUGIN = '''
from framework_bench.plugins.base import Backend
from framework_bench.plugins.contract import CONTRACT, BackendInfo, Capabilities, EnvSpec


class Declared(Backend):
    def info(self):
        return BackendInfo(name=__name__.removeprefix("declares_"), framework="a probe", contract={contract},
                           capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                           env=EnvSpec(requirements={{}}, framework_package="pytest"))
'''


@pytest.fixture
def declaring(tmp_path, monkeypatch, fbench_home):
    """Plugins declaring `contract=CONTRACT`, 4 and 6, installed through entry points."""
    site = tmp_path / "site"
    info = site / "fbench_declaring-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fbench-declaring\nVersion: 0.1\n")
    declared = {"named": "CONTRACT", "four": "4", "six": "6"}
    (info / "entry_points.txt").write_text(
        "[fbench.backends]\n" + "".join(f"{name} = declares_{name}:Declared\n" for name in declared))
    for name, value in declared.items():
        (site / f"declares_{name}.py").write_text(PLUGIN.format(contract=value))
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(plugins, "load_errors", {})
    yield
    for name in declared:
        sys.modules.pop(f"declares_{name}", None)


def test_a_plugin_outside_the_window_is_refused_in_one_line_naming_it_before_any_run(declaring, fbench_home, tmp_path):
    found = plugins.backends()
    assert found["named"].info.contract == 2 and found["four"].info.contract == 4
    assert "six" not in found
    why = plugins.load_errors["six"]
    assert why == (f"it declares plugin contract 6, newer than fbench {framework_bench.__version__}, which runs "
                   f"plugin contracts 1 to 5, contract 1 until 0.4.0: upgrade fbench")
    res = CliRunner().invoke(app, ["run", "--scenario", "tiny_cpu", "--backend", "six",
                                   "--db", str(tmp_path / "r.sqlite")])
    assert res.exit_code == 1 and "Traceback" not in res.output
    [line] = res.stderr.strip().splitlines()
    assert line.endswith(f"the backend 'six' is installed but broken: {why}"), line
    assert not list(fbench_home.glob("runs/*six*"))  # nothing was started


def test_a_contract_older_than_the_window_is_refused_naming_the_one_to_declare(declaring, monkeypatch):
    """What 0.4.0 will do with contract 1 (and `contract=CONTRACT` once contract 2 goes): refuse it
    in one line, never judge its runs by claims it was not written for."""
    monkeypatch.setattr(contract, "OLDEST_CONTRACT", 3)
    monkeypatch.setattr(contract, "OLDEST_DROPPED_IN", "0.5.0")
    found = plugins.backends()
    assert "four" in found and "named" not in found
    assert plugins.load_errors["named"] == (
        f"it declares plugin contract 2; fbench {framework_bench.__version__} runs plugin contracts 3 to 5, contract 3 "
        'until 0.5.0: update it to contract 5 (CONTRIBUTING.md, "Compatibility and the contract version")')


def test_an_unverified_run_is_no_share_of_the_reference():
    runs = [dict(scenario="s", backend=b, status=status, tgs=tgs)
            for b, status, tgs in [("torch", "ok", 100.0), ("old", "unverified", 300.0), ("new", "ok", 90.0)]]
    shares = Points(runs, "torch").shares
    assert {key: round(r.ratio * 100, 9) for key, r in shares.items()} == {("s", "torch"): 100.0, ("s", "new"): 90.0}


@pytest.mark.slow
def test_an_old_contract_plugin_runs_unverified_when_it_makes_no_claims_ok_when_it_makes_them(liars, tmp_path):
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions
    from framework_bench.data.packing import pack
    from framework_bench.present.chart_style import slug
    from framework_bench.present.plotting import plot_results
    from framework_bench.store.results import ResultStore

    from test_host_clock import SCENARIO

    data = pack(SCENARIO, progress=False, say=lambda msg: None)
    claimless = pipeline.run_one("lying_no_claims_contract1", SCENARIO, RunOptions(root=tmp_path), data=data, machine=CPU)
    assert claimless.status == "unverified", claimless.reason
    assert claimless.reason.startswith(f"claims not made by this contract-1 plugin (contract {CONTRACT} requires them):")
    for claim in ("clock", "rows", "throughput", "parameters", "settings"):
        assert claim in claimless.reason
    assert claimless.tgs > 0  # shown, with its figures
    honest = pipeline.run_one("lying_honest_contract1", SCENARIO, RunOptions(root=tmp_path), data=data, machine=CPU)
    assert honest.status == "ok", honest.reason

    with ResultStore(tmp_path / "r.sqlite") as store:
        store.add(claimless, SCENARIO)
        rows = store.latest_by_point()
    assert [r["status"] for r in rows] == ["unverified"]
    spread = f'id="tgs-spread-{slug("lying_no_claims_contract1")}"'  # drawn only for a plotted figure
    svg = next(p for p in plot_results(rows, tmp_path / "plots", published=False) if p.suffix == ".svg")
    assert spread not in svg.read_text()
    svg = next(p for p in plot_results(rows, tmp_path / "asked", published=False, include_unverified=True)
               if p.suffix == ".svg")
    assert spread in svg.read_text()


@pytest.mark.slow
def test_a_claim_newer_than_the_plugins_contract_leaves_it_unverified_at_the_current_one_invalid(liars, tmp_path):
    """The update projection is a claim of contract 3: the same worker without it is
    `unverified` as a plugin of contract 2 (written before that claim), `invalid` at 3."""
    from framework_bench.data.packing import pack
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions

    from test_host_clock import SCENARIO

    data = pack(SCENARIO, progress=False, say=lambda msg: None)
    old = pipeline.run_one("lying_no_update_claim_contract2", SCENARIO, RunOptions(root=tmp_path), data=data,
                           machine=CPU)
    assert old.status == "unverified", old.reason
    assert old.reason == f"claims not made by this contract-2 plugin (contract {CONTRACT} requires them): update"
    current = pipeline.run_one("lying_no_update_claim", SCENARIO, RunOptions(root=tmp_path), data=data, machine=CPU)
    assert current.status == "invalid", current.reason
    assert current.reason == f"claims missing, which plugin contract {CONTRACT} requires: update"


@pytest.mark.slow
def test_a_claim_the_backend_says_it_cannot_make_leaves_the_run_unverified_naming_why(liars, tmp_path):
    """A backend of the current contract may say, run by run, which claims it cannot make
    (LLaMA-Factory's v1 trainer does: `V1_UNCLAIMED`): the run is `unverified` with its words,
    not `invalid`; the same claim missing unsaid is `invalid`."""
    from framework_bench.data.packing import pack
    from framework_bench.run import pipeline
    from framework_bench.run.options import RunOptions

    from test_host_clock import SCENARIO

    data = pack(SCENARIO, progress=False, say=lambda msg: None)
    said = pipeline.run_one("lying_says_no_update", SCENARIO, RunOptions(root=tmp_path), data=data, machine=CPU)
    assert said.status == "unverified", said.reason
    assert said.reason == "claims the backend says it cannot make on this run: update (this loop keeps no initial weights)"
    assert {c.name: c.status for c in said.checks}["update"] == "unverified"
