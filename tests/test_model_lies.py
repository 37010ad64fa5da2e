"""Lies about the model: third-party backends that are the torch reference worker
with a few lines changed (tests/lying_backends) — the model fed half of each row, no
optimizer step, one layer of four with a meta-built full count, every label ignored, no
model run at all. The update projection after training tells each run that trained otherwise. Each ended `ok` under the host's earlier checks; judged against the torch
reference's run on the same rows and seed, each now ends `invalid` naming the check that
caught it, while the honest copy ends `ok`. Only the checks of a lie (LIE_CHECKS) fail for one,
so with them off (`FBENCH_UNCHECKED`) each passes: the test's lie is live."""

from __future__ import annotations

import os

import pytest

from backend_helpers import CPU, passed_but_for_load
from fbench_fixtures import LIARS, backend_env_or_skip

from framework_bench.run import compare, design, pipeline, referee
from framework_bench.run.launchers import base as launch
from framework_bench.run.options import RunOptions
from framework_bench.measure.verify import BLOCKING, UNCHECKED_ENV

# Real runs of the torch worker's lying copies: end to end, so in the slow part of the suite.
pytestmark = pytest.mark.slow

# The checks that catch a lie about the model: the initial weights, parity with the reference,
# the update projection and the host's clock, of the measured steps and of the time around them
# (a model that never runs leaves steps so short that the time between them is most of the span)
LIE_CHECKS = {"initial_weights", "parity", "clock", "pauses", "cpu", "update", "update_parity", "update_parts",
              "gaps", "warmup", "projection_delay", "warmup_update", "warmup_update_parity"}
# The check that catches each lie first (a lie may trip several).
# No optimizer step, or no label to learn from (weight decay 0): the weights never move, which
# the update projection says before any reference is compared.
CAUGHT_BY = {"half_rows": "parity", "no_update": "update", "one_layer": "initial_weights",
             "labels_ignored": "update"}


def test_a_model_that_never_runs_claims_figures_above_the_cpus_peak(world):
    """Steps that compute nothing are faster than this CPU can compute the model:
    the figures are impossible before any check (which is why the lie has no checks-off twin)."""
    r = run(world, "lying_no_model")
    assert r.status == "invalid" and r.reason.startswith("impossible figures:"), r.reason
    assert "above the peak of the CPU that ran it" in r.reason


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_cpu_run):
    """The lying backends installed through entry points, the packed stream and the reference
    run (the session's shared run of torch on tiny_cpu)."""
    backend_env_or_skip("torch")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(LIARS))
        import fbench_lying_backends

        site = tmp_path_factory.mktemp("lying-site")
        fbench_lying_backends.register_through_entry_points(site)
        mp.syspath_prepend(str(site))
        mp.setenv("PYTHONPATH", os.pathsep.join([str(LIARS), str(site), os.environ.get("PYTHONPATH", "")]))
        scn, data, reference = tiny_cpu_run("torch")
        root = tmp_path_factory.mktemp("runs")
        assert reference.status == "ok", reference.reason
        yield scn, data, root, reference, mp


def run(world, name: str):
    scn, data, root, reference, _ = world
    return referee.judge(pipeline.run_one(name, scn, RunOptions(root=root), data=data, machine=CPU), reference, scn)


def test_the_honest_copy_passes_parity(world):
    r = run(world, "lying_honest")
    assert r.status == "ok", r.reason
    checks = {c.name: c for c in r.checks}
    assert checks["parity"].status == "pass"
    # the same updates as the reference: its projection onto the vector revealed after the last step
    assert checks["update"].status == checks["update_parity"].status == "pass", checks["update_parity"].detail
    assert checks["update_parity"].figures["relative"] < 1e-9


@pytest.fixture(scope="module")
def lies(world):
    """Each lie's run, once: {lie: judged RunResult}."""
    return {lie: run(world, f"lying_{lie}") for lie in CAUGHT_BY}


# The checks a lie whose measured steps run forward only can fail besides the one under test:
# its steps are so short that the time between them weighs (tests/test_time_outside_steps.py).
SHORT_STEPS = ("clock", "gaps")


def judged_again(world, result, unchecked: set[str], reference=None, scn=None):
    """The run's folder read back and judged again with `unchecked` off, against `reference` on
    `scn` (the world's, unless given): `FBENCH_UNCHECKED` is read by the host only, so this is what
    running the lie with those checks off would give."""
    world_scn, _, _, world_reference, mp = world
    mp.setenv(UNCHECKED_ENV, ",".join(sorted(unchecked)))
    try:
        return referee.judge(pipeline.finish(pipeline.Prepared.of_run_dir(result.run_dir, result.backend, None),
                                             launch.Outcome("ok", 0, result.wall_seconds, "")),
                             reference or world_reference, scn or world_scn)
    finally:
        mp.delenv(UNCHECKED_ENV)


@pytest.mark.parametrize("lie, detail", [("no_update", "the weights never changed"),
                                         ("one_layer", "moved otherwise"), ("half_rows", "moved otherwise"),
                                         ("labels_ignored", "the weights never changed")])
def test_the_update_projection_alone_tells_a_run_that_trained_otherwise(world, lies, lie, detail):
    """With every other check of a lie off, the update checks still make the run invalid."""
    r = judged_again(world, lies[lie], LIE_CHECKS - {"update", "update_parity"})
    assert r.status == "invalid", (r.status, r.reason)
    assert detail in r.reason, r.reason


@pytest.mark.parametrize("lie", sorted(CAUGHT_BY))
def test_a_model_lie_ends_invalid_naming_the_check(lies, lie):
    r = lies[lie]
    assert r.status == "invalid", (lie, r.status, r.reason)
    assert f"{CAUGHT_BY[lie]} check failed" in r.reason, r.reason
    # Every other blocking check held: without the checks of a lie the run would be `ok`.
    failing = {c.name for c in r.checks if c.status == "fail" and c.name in BLOCKING}
    assert failing and failing <= LIE_CHECKS, (lie, failing)


@pytest.mark.parametrize("lie", sorted(CAUGHT_BY))
def test_with_the_checks_off_each_lie_passes(world, lies, lie):
    r = judged_again(world, lies[lie], LIE_CHECKS)
    assert r.status == "ok", r.reason


def test_a_backend_normalising_otherwise_is_judged_against_the_reference_trained_its_way(world):
    """At grad_accum 2 a loop taking the mean of per-micro-batch means (XTuner's way,
    here an honest copy of the torch loop) weighs tokens otherwise than the torch reference: the
    compare judges it against a second reference run trained with loss_scheme micro_mean_mean, made
    after it, at every step and on its update; against the round's reference it could only be unverified."""
    from framework_bench.measure import losses, update
    from framework_bench.run import compare

    scn, _, root, _, _ = world
    accumulated = scn.model_copy(update={"name": f"{scn.name}_grad_accum2", "grad_accum": 2})
    stored = []
    results = compare.compare([accumulated], ["lying_honest_micro_means"], RunOptions(root=root),
                              on_result=lambda r, s: stored.append(r.backend))
    mine, reference = results
    assert stored == ["torch", "lying_honest_micro_means"]  # the judging run is not a trial: not stored
    assert losses.scheme_of(mine) == "micro_mean_mean" and losses.scheme_of(reference) == "step_token_mean"
    assert mine.status == "ok", mine.reason
    checks = {c.name: c for c in mine.checks}
    assert checks["parity"].status == "pass" and "both micro_mean_mean, every step judged" in checks["parity"].detail
    assert checks["update_parity"].status == "pass", checks["update_parity"].detail
    assert any("trained with loss_scheme micro_mean_mean" in n for n in mine.notes), mine.notes
    assert losses.parity(mine, reference, scn.precision).status == "unverified"  # the round's reference alone
    assert update.parity(mine, reference, scn.precision).status == "unverified"


def test_a_worker_copying_the_references_files_passes_only_where_the_reference_ran_first(world, tmp_path):
    """A worker that trains nothing and copies the loss records and update
    projection of the newest torch run beside it. Where the reference ran first with the same
    projection vector (the order compare used to have) the copy passes every check: the lie is
    live. In compare each round projects onto its own vector, and where the reference runs first
    (round 2) its folder is off the disk until the round ends, so whatever the worker finds to
    copy (an earlier round's reference, a run before the compare) is another vector's: invalid
    in every round."""
    from framework_bench.run import compare

    scn, data, _, _, _ = world
    # Forward-only steps: 15 of them span more than the CPU share needs to be read on a quiet machine
    # (clock_checks.MIN_CPU_SPAN_SECONDS); 5 spanned 0.17 s, leaving the copy `unverified`.
    scn = scn.model_copy(update={"steps": scn.steps.model_copy(update={"measured": 15})})
    root = tmp_path / "runs"  # the liar's neighbours: only what this test made
    first = pipeline.run_one("torch", scn, RunOptions(root=root), data=data, machine=CPU)
    copier = referee.judge(pipeline.run_one("lying_copies_reference", scn, RunOptions(root=root), data=data,
                                            machine=CPU), first, scn)
    assert copier.status == "ok", copier.reason  # the reference's files were there to copy
    results = compare.compare([scn], ["lying_copies_reference"], RunOptions(root=root), repeat=2, warmup_rounds=0)
    liars = [r for r in results if r.backend == "lying_copies_reference"]
    assert [r.status for r in liars] == ["invalid", "invalid"], [r.reason for r in liars]
    assert all("update check failed" in r.reason and "the host revealed" in r.reason for r in liars)
    assert all(r.status == "ok" for r in results if r.backend == "torch")


def test_a_worker_replaying_an_earlier_runs_training_is_invalid_unless_the_seed_is_pinned(world, tmp_path):
    """A worker that keeps its final weights and loss records beside the runs and, in every later
    run of the scenario, throws its own training away and replays them. A compare draws a fresh
    seed, so what it kept was trained from other initial weights: invalid. With the seed pinned to
    the kept run's (`--seed`), the replay passes every check: the lie is live, and why a pinned
    seed's rows say replay is not excluded."""
    scn, data, _, reference, _ = world
    root = tmp_path / "runs"
    first = pipeline.run_one("lying_replays_kept", scn, RunOptions(root=root, seed=reference.seed), data=data, machine=CPU)
    assert passed_but_for_load(referee.judge(first, reference, scn)), first.reason  # trained, and kept
    assert (root.parent / f"kept-{scn.name}" / "weights.pt").is_file()
    fresh = design.compare_seed(None)
    fresh_reference = pipeline.run_one("torch", scn, RunOptions(root=root, seed=fresh), data=data, machine=CPU)
    replayed = referee.judge(pipeline.run_one("lying_replays_kept", scn, RunOptions(root=root, seed=fresh), data=data,
                                              machine=CPU), fresh_reference, scn)
    assert replayed.status == "invalid" and "parity check failed" in replayed.reason, replayed.reason
    pinned = referee.judge(pipeline.run_one("lying_replays_kept", scn, RunOptions(root=root, seed=reference.seed),
                                            data=data, machine=CPU), reference, scn)
    assert passed_but_for_load(pinned), pinned.reason


def test_training_before_the_first_step_is_invalid_by_the_time_from_the_reveal(world, monkeypatch):
    """A worker that trains every step once the initial seed is revealed, before its first step's
    clock, then runs the timed steps forward only and records the losses it kept: its weights,
    losses and update are the honest ones, its TGS far above. Its weights when the warm-up ends
    are the trained ones (`warmup_update_parity`), and the time from the reveal to its first step,
    held against the reference's, is too long (`first_window`, which stands aside beside other
    work): either makes it invalid; with both off it passes (the lie is live), at well above the
    reference's TGS. The reference runs right before it, so
    both windows meet the same moment's load; 12 measured steps, so that the lie's forward-only
    steps last long enough for the host to read their CPU share. Those steps are so short that
    the time between them can weigh too (`SHORT_STEPS`): left out, so the checks under test speak."""
    scn, _, root, _, _ = world
    scn = scn.model_copy(update={"name": "tiny_cpu_12_steps", "steps": scn.steps.model_copy(update={"measured": 12})})
    monkeypatch.setenv(UNCHECKED_ENV, ",".join(SHORT_STEPS))
    reference = pipeline.run_one("torch", scn, RunOptions(root=root), machine=CPU)
    r = referee.judge(pipeline.run_one("lying_trained_before_first_step", scn, RunOptions(root=root), machine=CPU),
                      reference, scn)
    monkeypatch.delenv(UNCHECKED_ENV)
    assert r.status == "invalid" and "warmup_update_parity check failed" in r.reason, r.reason
    assert {c.name for c in r.checks if c.status == "fail" and c.name in BLOCKING} - {"first_window", *SHORT_STEPS} == {
        "warmup_update_parity"}
    passed = judged_again(world, r, {"first_window", "warmup_update_parity", *SHORT_STEPS}, reference, scn)
    assert passed.status == "ok", passed.reason
    assert passed.tgs > 1.5 * reference.tgs, (passed.tgs, reference.tgs)


def test_adapters_smaller_than_claimed_are_invalid_in_native_mode(world, tmp_path, monkeypatch):
    """Native mode: a worker that trains the scenario's r=8 adapters while its ledger claims r=64
    (its trainable and parameter counts claimed to match) is judged against the reference trained
    with the adapters it claims, at every step and on its update: invalid. Judged at step 1 only,
    as native adapters were before (the check off), it passes: the lie is live."""
    from framework_bench.run.reference import NATIVE_ADAPTERS, judging_reference
    from framework_bench.scenario import scenario

    scn = scenario.load("tiny_cpu_lora")
    options = RunOptions(root=tmp_path / "runs", settings_mode="native")
    liar = pipeline.run_one("lying_claims_r64", scn, options, machine=CPU)
    reference = pipeline.run_one("torch", scn, options, machine=CPU)
    assert liar.status == reference.status == "ok", (liar.reason, reference.reason)
    assert (liar.settings["lora_rank"], reference.settings["lora_rank"]) == (64, 8)
    made: dict = {}

    def judged():
        r = liar.model_copy(deep=True)
        run_reference = lambda trained, scheme: pipeline.run_one("torch", trained, options, machine=CPU)  # noqa: E731
        return referee.judge(r, judging_reference(r, reference, scn, run_reference, made), scn)

    caught = judged()
    assert caught.status == "invalid" and "update_parity" in caught.reason, caught.reason
    assert any("lora_rank" not in n and "rank 64" in n for n in caught.notes), caught.notes  # the reference's adapters
    monkeypatch.setenv(UNCHECKED_ENV, NATIVE_ADAPTERS)
    passed = judged()
    assert passed.status == "ok", passed.reason


# Misconfigurations a bf16 run's tolerances hide (each moves the losses and the update less than
# bf16's bounds): judged in the run's fp32 twin.
# no gradient clipping is shown in its fp32 twin by tests/test_twin.py's sequence-parallel compare
BF16_MISCONFIGURED = ("adamw_otherwise", "dropout", "per_document_mask")


@pytest.fixture(scope="module")
def bf16_compare(world):
    """One compare of the misconfigured copies, the frozen embeddings and the honest copy on a bf16
    tiny_cpu, torch the reference: (scenario, {backend: result}). 1k tokens a row: a bf16 loop's
    first step on CPU costs seconds of kernel set-up, which at 512 made an honest copy's warm-up
    heavier than 16 of its measured steps (the `warmup` check)."""
    scn, _, root, _, _ = world
    bf16 = scn.model_copy(update={"name": "tiny_cpu_bf16", "precision": "bf16", "context_length": 1024})
    results = compare.compare([bf16], [f"lying_{lie}" for lie in (*BF16_MISCONFIGURED, "frozen_embeddings", "honest")],
                              RunOptions(root=root / "bf16-twins"))
    return bf16, {r.backend: r for r in results}


def test_frozen_embeddings_in_bf16_fail_the_parts_of_the_update(world, bf16_compare):
    """A copy that never updates the embeddings, in bf16: the loss parity (1e-2) cannot see it, and
    the whole update's projection barely, but the embeddings' own |dw| is 0 against the
    reference's. With `update_parts` off (and its fp32 twin's check) the lie passes: it is live."""
    bf16, results = bf16_compare
    r = results["lying_frozen_embeddings"]
    checks = {c.name: c for c in r.checks}
    assert r.status == "invalid" and "update_parts check failed" in r.reason, r.reason
    assert "embeddings |dw| 0.000e+00" in checks["update_parts"].detail and "(frozen)" in checks["update_parts"].detail
    assert checks["parity"].status == "pass", checks["parity"].detail  # the losses hide it in bf16
    assert {c.name: c.status for c in results["lying_honest"].checks}["update_parts"] == "pass"
    off = {"update_parts", "fp32_twin"} | ({"update_parity"} if checks["update_parity"].status == "fail" else set())
    passed = judged_again(world, r, off, results["torch"], bf16)
    assert passed.status == "ok", passed.reason


def test_the_honest_copy_passes_its_fp32_twin(bf16_compare):
    _, results = bf16_compare
    honest = results["lying_honest"]
    assert honest.status == "ok", honest.reason
    twin_check = {c.name: c for c in honest.checks}["fp32_twin"]
    assert twin_check.status == "pass" and "parity pass" in twin_check.detail, twin_check.detail
    assert any("fp32 twin (ok" in n for n in honest.notes), honest.notes
    assert "fp32_twin" not in {c.name for c in results["torch"].checks}  # the reference judges, it is not judged


@pytest.mark.parametrize("lie", BF16_MISCONFIGURED)
def test_a_misconfigured_bf16_step_is_invalid_in_its_fp32_twin_and_passes_without_it(world, bf16_compare, lie):
    bf16, results = bf16_compare
    r = results[f"lying_{lie}"]
    checks = {c.name: c for c in r.checks}
    assert r.status == "invalid" and "fp32_twin check failed: in fp32" in r.reason, r.reason
    # bf16's bounds hide it; dropout's random draws, different in every compare (its seed), once moved
    # the bf16 update past them too: with it, what caught it in bf16 is left out below as well
    caught_in_bf16 = {n for n in ("parity", "update_parity", "update_parts", "warmup_update_parity") if checks[n].status == "fail"}
    assert lie == "dropout" or not caught_in_bf16, caught_in_bf16
    off = judged_again(world, r, {"fp32_twin", *caught_in_bf16}, results["torch"], bf16)
    assert off.status == "ok", off.reason
