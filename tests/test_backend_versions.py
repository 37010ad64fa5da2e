"""A backend at a version (`trl@transformers==5.23.0`, `llamafactory@0.9.4`): its name as stored, its
env's requirements, the plugin's declared releases, and a real compare of one framework at two
versions of transformers, each refereed beside the reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from framework_bench.cli import app
from framework_bench.plugins import pins, registry


def test_a_backend_at_a_version_is_stored_under_one_spelling_and_a_pin_that_is_no_release_is_refused():
    assert registry.canonical("trl@TRL==1.15.0@PEFT==0.17.1@Accelerate==1.10.1") == \
        "trl@1.15.0@accelerate==1.10.1@peft==0.17.1"
    assert registry.canonical("llamafactory@0.9.4") == "llamafactory@0.9.4"
    assert registry.canonical("trl") == "trl"
    for spec, said in [("trl@transformers>=5", "no exact pin"), ("trl@latest", "not a release"),
                       ("trl@1.15.0@trl==1.14.0", "pinned twice"), ("trl@", "not a release")]:
        with pytest.raises(pins.BadSpec, match=said):
            registry.canonical(spec)
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "trl@transformers>=5"])
    assert res.exit_code != 0 and "no exact pin" in res.output, res.output


def test_the_env_of_a_backend_at_a_version_is_its_plugins_requirements_with_the_pins_in_place(fbench_home):
    backend = registry.get("trl@1.15.0@peft==0.17.1@tokenizers==0.22.1")
    own = registry.get("trl").info.env.requirements["cpu"].read_text().splitlines()
    made = backend.info.env.requirements["cpu"].read_text().splitlines()
    assert backend.name == "trl@1.15.0@peft==0.17.1@tokenizers==0.22.1"
    assert backend.info.env.requirements["cpu"].is_relative_to(fbench_home)
    pinned = {line.split("==")[0]: line.split("  #")[0] for line in made if "==" in line and line.endswith(backend.name)}
    assert pinned == {"trl": "trl==1.15.0", "peft": "peft==0.17.1", "tokenizers": "tokenizers==0.22.1"}
    # every other line as the plugin wrote it, in its order; the pin of a distribution it did not list, last
    assert [line for line in made if not line.endswith(backend.name)] == \
        [line for line in own if not line.startswith(("trl==", "peft=="))]
    assert made[-1].startswith("tokenizers==0.22.1")


def test_a_version_outside_the_releases_its_plugin_declares_is_unsupported_naming_them_before_any_env(fbench_home):
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "trl@0.29.0", "--no-reference",
                                   "--json", "--db", str(fbench_home / "r.sqlite")])
    (run,) = json.loads(res.stdout)["runs"]
    assert run["backend"] == "trl@0.29.0" and run["status"] == "unsupported", run
    assert "supports trl >=1.0,<2, not 0.29.0" in run["reason"], run["reason"]
    assert not (fbench_home / "envs" / "trl@0.29.0").exists()
    env = CliRunner().invoke(app, ["env", "create", "trl@0.29.0"])
    assert env.exit_code != 0 and "supports trl >=1.0,<2" in env.output, env.output
    assert not (fbench_home / "envs" / "trl@0.29.0").exists()


# The pair that installs here: TRL 1.16 on the transformers its env pins (5.6.0) and on 5.23.0, a
# release TRL allows (>= 4.56.2) that the local index offers; pip adds only transformers (and what
# it asks) to the layer over the trl env.
PAIR = ("trl", "trl@transformers==5.23.0")


@pytest.mark.slow
def test_one_framework_at_two_versions_in_one_compare_is_refereed_and_named_with_the_versions(home_with_envs):
    from fbench_fixtures import backend_env_or_skip
    from framework_bench.envs import venvs

    backend_env_or_skip("trl")
    res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", ",".join(PAIR),
                                   "--db", str(home_with_envs / "r.sqlite"), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    counted = out["runs"]
    assert {r["backend"] for r in counted} == {*PAIR, "torch"}
    assert all(r["status"] == "ok" for r in counted), [(r["backend"], r["reason"]) for r in counted if r["status"] != "ok"]
    versions = {r["backend"]: r["settings"]["transformers_version"] for r in counted}
    assert versions[PAIR[0]] == "5.6.0" and versions[PAIR[1]] == "5.23.0", versions
    # the two versions' verdict, as between any two backends
    assert any(PAIR[1] in v and "trl" in v.replace(PAIR[1], "") for v in out["verdicts"]), out["verdicts"]
    # its env: a layer over the trl env, holding transformers 5.23.0 and seeing the rest there
    env = venvs.inspect(PAIR[1])
    record = json.loads((env.path / venvs.RECORD).read_text())
    assert env.ready and Path(record["over"]).resolve() == venvs.env_path("trl").resolve(), record
    assert env.versions["transformers"] == "5.23.0" and env.versions["trl"] == venvs.inspect("trl").versions["trl"]


def test_bisect_halves_down_to_the_first_release_past_the_slowdown():
    """The search over the releases, each probe answering by the release alone: the first slow one
    is found whichever it is, in no more probes than halving allows; a last release no slower than
    the first ends the search at once."""
    import math

    from packaging.version import Version

    from framework_bench.run.bisect import Bisection, Probe, search

    releases = [f"5.{minor}.0" for minor in range(6, 24)]
    for first_bad in releases[1:]:
        found = Bisection(package="transformers", good=releases[0], bad=releases[-1], releases=releases, listed=True)
        search(found, lambda v: Probe(version=v, bad=Version(v) >= Version(first_bad)))
        assert found.first_bad == first_bad
        assert len(found.probes) <= 1 + math.ceil(math.log2(len(releases) - 1)), [p.version for p in found.probes]
    found = Bisection(package="transformers", good=releases[0], bad=releases[-1], releases=releases, listed=True)
    search(found, lambda v: Probe(version=v, bad=False))
    assert found.first_bad is None and [p.version for p in found.probes] == [releases[-1]]


def test_bisect_refuses_a_good_release_that_is_not_the_earlier(fbench_home):
    res = CliRunner().invoke(app, ["bisect", "--backend", "trl", "--package", "transformers", "--good", "5.23.0",
                                   "--bad", "5.6.0", "--scenario", "tiny_cpu", "--db", str(fbench_home / "r.sqlite")])
    assert res.exit_code == 1 and "--good 5.23.0 must be an earlier release than --bad 5.6.0" in res.output, res.output


def test_two_versions_of_one_plugin_in_a_compare_say_where_their_loss_curves_part():
    from framework_bench.present.diff import version_losses
    from framework_bench.scenario import scenario

    def run(backend: str, seed: int, curve: dict[int, float]) -> dict:
        return {"scenario": "tiny_cpu", "backend": backend, "seed": seed, "loss_curve": {str(k): v for k, v in curve.items()}}

    alike = {1: 10.0, 2: 9.0, 3: 8.5}
    records = [run("trl", 7, alike), run("trl@transformers==5.23.0", 7, alike), run("torch", 7, alike),
               run("trl@1.15.0", 7, {1: 10.0, 2: 9.0, 3: 8.0})]
    lines = version_losses(records, {"tiny_cpu": scenario.load("tiny_cpu")})
    assert lines == [
        "tiny_cpu: trl and trl@1.15.0: loss curves part at step 3: 8.5 vs 8.0 (seed 7)",
        "tiny_cpu: trl and trl@transformers==5.23.0: loss curves agree over 3 steps (seed 7, within 1e-05)",
        "tiny_cpu: trl@1.15.0 and trl@transformers==5.23.0: loss curves part at step 3: 8.0 vs 8.5 (seed 7)",
    ], lines
