"""Claims required by contract: a plugin declares the contract it was
written against; at the current one a claim not made makes the run `invalid` (the claimless
fake: tests/test_host_clock.py), at contract 1 the run still goes, `unverified`, kept out of
"% of reference" and of the charts unless asked."""

from __future__ import annotations

import pydantic
import pytest

from backend_helpers import CPU
from framework_bench.plugins import registry as plugins
from framework_bench.plugins.contract import CONTRACT, BackendInfo, Capabilities, EnvSpec
from framework_bench.present.verdict import Points


def test_a_plugin_declaring_no_contract_is_of_contract_1_and_none_beyond_the_hosts():
    base = dict(name="x", framework="x", capabilities=Capabilities(cpu=True, gpu=False, sequence_parallel=False, varlen=False),
                env=EnvSpec(requirements={}, framework_package="x"))
    assert BackendInfo(**base).contract == 1 and CONTRACT == 4
    with pytest.raises(pydantic.ValidationError):
        BackendInfo(**base, contract=CONTRACT + 1)


def test_the_bundled_backends_declare_the_current_contract():
    for name in ("torch", "xtuner", "llamafactory"):
        assert plugins.get(name).info.contract == CONTRACT, name


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
