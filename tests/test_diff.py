"""`fbench diff`: two compares from the store side by side, through the whole loop (every check,
the store) on the seeded noisy fakes: an A/A pair of compares shows no difference, and a backend
whose upgrade made its steps 25% longer (its TGS 20% lower) is found slower, gating CI."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from framework_bench.cli import app


@pytest.mark.slow  # starts the host's own process (fake compares)
def test_diff_finds_no_difference_between_alike_compares_and_the_slowdown_an_upgrade_brought(fakes, tmp_path, monkeypatch):
    monkeypatch.setenv("FBENCH_REFERENCE", "fake_noisy_twin")
    db = str(tmp_path / "r.sqlite")

    def compare(*seed: str) -> None:
        res = CliRunner().invoke(app, ["compare", "--scenario", "tiny_cpu", "--backends", "fake_noisy", "--repeat", "3",
                                       "--warmup-rounds", "0", "--db", db, "--out", str(tmp_path / "plots"), *seed])
        assert res.exit_code == 0, res.output

    def diff(*args: str):
        return CliRunner().invoke(app, ["diff", "--db", db, "--fail-if-slower", "5", *args])

    compare("--seed", "7")  # pinned: the loss curves are compared
    assert "diff needs two" in diff().stderr
    compare("--seed", "7")
    same = diff("--json")
    assert same.exit_code == 0, same.output
    out = json.loads(same.stdout)
    assert {p["backend"]: p["verdict"] for p in out["pairs"]} == {"fake_noisy": "no difference",
                                                                   "fake_noisy_twin": "no difference"}
    assert all(p["changes"] == [] and "loss curves agree" in p["losses"] for p in out["points"])
    first, second = out["before"], out["after"]

    # fake_noisy upgraded: the entry point now names a plugin of the same name whose steps take 25% longer
    fakes.register_through_entry_points(tmp_path / "site", {**fakes.ENTRY_POINTS,
                                                             "fake_noisy": "fbench_fake_backends:noisy_upgraded"})
    compare()  # a fresh seed: no loss curve to compare with the earlier one's
    slower = diff()
    assert slower.exit_code == 1, slower.output
    low, high = map(float, re.search(r"tiny_cpu: fake_noisy is [\d.]+% slower in the later compare "
                                     r"\(95% CI ([\d.]+) to ([\d.]+)%, 3 trials each\)", slower.stdout).groups())
    assert low <= 20 <= high
    assert "no difference detected for fake_noisy_twin" in slower.stdout
    assert ("fake_noisy_twin: no change in version or settings; no run of one compare started from a seed of the "
            "other's: loss curves not compared") in slower.stdout
    assert "slower in" in slower.stderr and "fake_noisy (" in slower.stderr and "fake_noisy_twin" not in slower.stderr
    # named by a start of their ids, the first two compares again: no difference
    assert diff(first[:-2], second).exit_code == 0
    assert "give both" in diff(first).stderr
    assert "no compare 'nope'" in diff("nope", second).stderr
