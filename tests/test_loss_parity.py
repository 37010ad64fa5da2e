"""Parity against the reference: from the same initial weights and rows,
each backend's canonical step-1 loss equals the torch reference's within 1e-5 (fp32), at
grad_accum 1 and 2, with each framework's loss normalisation named; and the parity judgement
itself on figures where it must pass or fail."""

from __future__ import annotations

import json

import pytest

from backend_helpers import CPU, passed_but_for_load
from fbench_fixtures import backend_env_or_skip

from framework_bench.measure.verify import UNCHECKED_ENV
from framework_bench.run import pipeline, referee
from framework_bench.run.options import RunOptions
from framework_bench.scenario import scenario
from framework_bench.data.packing import pack
from framework_bench.measure import losses, update
from framework_bench.measure.losses import needed_reference_loss, parity
from framework_bench.measure.metrics import RunResult
from framework_bench.testing import parity_variants

BACKENDS = ("torch", "xtuner", "llamafactory")


# Per scheme, one step's record of two micro-batches of 300 and 211 supervised tokens (after the
# shift; 301 and 212 labels before it), as each way of normalising writes it.
RECORDS = {
    "step_token_mean": [{"divisor": 511, "scale": 1.0}, {"divisor": 511, "scale": 1.0}],
    "micro_mean_mean": [{"divisor": 300, "scale": 0.5}, {"divisor": 211, "scale": 0.5}],
    "step_label_mean": [{"divisor": 513, "scale": 1.0}, {"divisor": 513, "scale": 1.0}],
    "unknown": [{"divisor": 511}, {"divisor": 511}],
}


def ok(backend: str, curve: dict[int, float], seed: int = 1024, scheme: str = "step_token_mean", run_dir=None) -> RunResult:
    """An `ok` run whose per-micro-batch records (in `run_dir`) show `scheme`; its loss curve as given."""
    if run_dir is not None:
        (run_dir / "losses").mkdir(parents=True)
        (run_dir / "losses" / "rank0.jsonl").write_text("".join(
            json.dumps({"step": step, "micro": i, "loss": 6.0, "supervised": sup, "labelled": sup + 1, **rec}) + "\n"
            for step in curve for i, (rec, sup) in enumerate(zip(RECORDS[scheme], (300, 211)))))
    return RunResult(backend=backend, scenario="tiny_cpu", status="ok", seed=seed, loss_curve=curve,
                     settings={"loss_normalization": "the torch loop's words, whatever was done"}, run_dir=run_dir)


def test_parity_judges_every_step_where_the_records_normalise_alike(tmp_path):
    """"Alike" is the normalisation the records show, never the wording: a run
    weighted as the reference is judged at every step, another one is `unverified` past step 1
    (naming the reference it needs), never passed unseen."""
    at = iter(range(100)).__next__
    ref = ok("torch", {1: 6.2760124, 2: 6.2086824}, run_dir=tmp_path / str(at()))
    # the same normalisation: every step judged (an update skipped shows at step 2)
    same = parity(ok("torch_copy", {1: 6.2760124, 2: 6.2760124}, run_dir=tmp_path / str(at())), ref, "fp32")
    assert same.status == "fail" and same.detail.startswith("step 2 off")
    good = parity(ok("torch_copy", {1: 6.2760124, 2: 6.2086824}, run_dir=tmp_path / str(at())), ref, "fp32")
    assert good.status == "pass" and "both step_token_mean, every step judged" in good.detail
    # another normalisation: step 1 judged, the rest unverified, naming the reference it needs
    xtuner = ok("xtuner", {1: 6.2760124 * (1 + 5e-6), 2: 6.3}, scheme="micro_mean_mean", run_dir=tmp_path / str(at()))
    other = parity(xtuner, ref, "fp32")
    assert other.status == "unverified" and "needs a reference run with loss_scheme micro_mean_mean" in other.detail
    assert needed_reference_loss(xtuner, ref).scheme == "micro_mean_mean"
    # against a reference trained that way: judged at every step
    ref_mm = ok("torch", {1: 6.2760124, 2: 6.3 * (1 + 2e-6)}, scheme="micro_mean_mean", run_dir=tmp_path / str(at()))
    assert parity(xtuner, ref_mm, "fp32").status == "pass" and needed_reference_loss(xtuner, ref_mm).scheme is None
    assert parity(ok("xtuner", {1: 6.2760124, 2: 6.4}, scheme="micro_mean_mean", run_dir=tmp_path / str(at())),
                  ref_mm, "fp32").status == "fail"
    # records that do not say what was applied before backward (an older plugin): unverified, no reference helps
    old = ok("old", {1: 6.2760124, 2: 6.2086824}, scheme="unknown", run_dir=tmp_path / str(at()))
    unknown = parity(old, ref, "fp32")
    assert unknown.status == "unverified" and "normalisation of old is unknown" in unknown.detail
    assert needed_reference_loss(old, ref).scheme is None
    # step 1 fails whatever the normalisation
    off = parity(ok("xtuner", {1: 6.3272, 2: 6.3}, scheme="micro_mean_mean", run_dir=tmp_path / str(at())), ref, "fp32")
    assert off.status == "fail" and "6.3272000 vs torch 6.2760124" in off.detail
    bf16 = ok("xtuner", {1: 6.30}, run_dir=tmp_path / str(at()))
    assert parity(bf16, ok("torch", {1: 6.2760124}, run_dir=tmp_path / str(at())), "bf16").status == "pass"  # 0.4 % within 1e-2
    assert "seeds differ" in parity(ok("xtuner", {1: 6.2760124}, seed=1), ref, "fp32").detail
    assert "no per-micro-batch losses" in parity(ok("lying", {}), ref, "fp32").detail
    failed = RunResult(backend="xtuner", scenario="tiny_cpu", status="invalid", reason="initial_weights check failed")
    assert "ended invalid" in parity(failed, ref, "fp32").detail


def test_check_backend_variants_are_grad_accum_2_two_processes_with_zero_2_next_and_lora():
    (ga_label, [ga]), (two_label, two), (lora_label, [lora]) = parity_variants(scenario.load("tiny_cpu"))
    assert lora_label == "LoRA" and lora.finetune.method == "lora"
    assert ga_label == "grad_accum 2" and ga.grad_accum == 2 and two_label == "2 processes"
    assert [s.name for s in two] == ["multiproc_tiny_cpu_1x2", "multiproc_tiny_cpu_zero2"]
    assert all(s.cluster.gpus == 2 for s in two) and two[1].zero_stage == 2


@pytest.fixture(scope="module", params=[1, 2], ids=["grad_accum1", "grad_accum2"])
def three_runs(request, tmp_path_factory, tiny_cpu_run):
    """(scenario, {backend: run}, {scheme: the torch reference trained that way})."""
    for b in BACKENDS:
        backend_env_or_skip(b)
    root = tmp_path_factory.mktemp("runs")
    if request.param == 1:  # the session's shared runs of tiny_cpu
        scn, data, _ = tiny_cpu_run(BACKENDS[0])
        runs = {b: tiny_cpu_run(b)[2] for b in BACKENDS}
    else:  # the module's torch run at grad_accum 2 (`accum2`), the frameworks' beside it
        scn, data, root, reference = request.getfixturevalue("accum2")
        runs = {"torch": reference,
                **{b: pipeline.run_one(b, scn, RunOptions(root=root), data=data, machine=CPU) for b in BACKENDS[1:]}}
    references = {losses.scheme_of(runs["torch"]): runs["torch"]}
    for r in runs.values():
        needed = losses.needed_reference_loss(r, runs["torch"]).scheme
        if needed and needed not in references:
            references[needed] = pipeline.run_one("torch", scn, RunOptions(root=root, loss_scheme=needed), data=data,
                                                  machine=CPU)
    return scn, runs, references


# The normalisation each framework's records show on tiny_cpu's rows (a row starting mid-answer
# has one more label before the shift than after it: HF Trainer counts it, the others do not).
SCHEMES = {1: {"torch": "step_token_mean", "xtuner": "step_token_mean", "llamafactory": "step_label_mean"},
           2: {"torch": "step_token_mean", "xtuner": "micro_mean_mean", "llamafactory": "step_label_mean"}}


@pytest.mark.slow  # real runs of the three trainers
def test_same_initial_weights_and_every_step_and_update_as_the_reference_that_normalises_alike(three_runs):
    """Each framework is judged at every step and on its update, against the
    torch reference trained with the normalisation its records show (at grad_accum 2 XTuner's
    mean of per-micro-batch means: the torch loop with loss_scheme micro_mean_mean)."""
    scn, runs, references = three_runs
    assert {b: losses.scheme_of(r) for b, r in runs.items()} == SCHEMES[scn.grad_accum]
    for b, r in runs.items():
        assert r.status == "ok", (b, r.reason)
        checks = {c.name: c for c in r.checks}
        assert checks["initial_weights"].status == "pass", (b, checks["initial_weights"])
        assert r.seed == 1024 and sorted(r.loss_curve) == list(range(1, scn.steps.total + 1))
        # keys once recorded on one side only appear for every backend, read from its live objects
        assert r.settings["sequence_parallel"] == 1 and r.settings["token_count_sync"] is False, b
        assert r.settings["compile"] is False, b
        reference = references[losses.scheme_of(r)]
        assert reference.status == "ok" and losses.scheme_of(reference) == losses.scheme_of(r), (b, reference.reason)
        check = parity(r, reference, scn.precision)
        assert check.status == "pass" and "every step judged" in check.detail, (b, check.detail)
        moved = update.parity(r, reference, scn.precision)
        assert moved.status == "pass", (b, moved.detail)
        assert abs(r.loss_curve[1] / runs["torch"].loss_curve[1] - 1) <= 1e-5
        if b != "torch" and losses.scheme_of(r) != "step_token_mean":
            # against the reference as it trains by default: step 1 judged, the rest unverified, never passed
            other = parity(r, runs["torch"], scn.precision)
            assert other.status == "unverified" and f"loss_scheme {losses.scheme_of(r)}" in other.detail, (b, other.detail)
            assert update.parity(r, runs["torch"], scn.precision).status == "unverified"


@pytest.fixture(scope="module")
def accum2(tmp_path_factory):
    """tiny_cpu at grad_accum 2: the scenario, its packed rows, the torch reference's run, made
    once for the module (the frameworks' parity at grad_accum 2 and the lies judged there)."""
    backend_env_or_skip("torch")
    scn = scenario.load("tiny_cpu").model_copy(update={"name": "tiny_cpu_grad_accum2", "grad_accum": 2})
    data = pack(scn, progress=False, say=lambda msg: None)
    root = tmp_path_factory.mktemp("accum2")
    return scn, data, root, pipeline.run_one("torch", scn, RunOptions(root=root), data=data, machine=CPU)


# What training otherwise fails beside the reference: the losses, the update, its parts, and the
# weights when the warm-up ended.
TRAINING_CHECKS = ("parity", "update_parity", "update_parts", "warmup_update_parity")


@pytest.mark.slow  # real runs of the torch worker's lying copies
@pytest.mark.parametrize("lie, grad_accum", [("sgd_xtuner_words", 1), ("no_clipping", 1), ("dropped_micro", 2),
                                             ("honest", 2)])
def test_training_otherwise_is_invalid_whatever_the_normalisation_words(lie, grad_accum, liars, tiny_cpu_run, accum2,
                                                                        tmp_path, monkeypatch):
    """A torch copy that trains with SGD while recording XTuner's words, without
    clipping, or dropping a micro-batch at grad_accum 2 records the torch loop's normalisation
    (its divisors and scales), so it is judged at every step and on its update: `invalid`. Run
    once with those checks off, it ends `ok` (the lie is live); the judgement the compare makes
    then fails it. The honest copy at grad_accum 2 passes both."""
    scn, data, root, reference = accum2 if grad_accum == 2 else (*tiny_cpu_run("torch")[:2], tmp_path, tiny_cpu_run("torch")[2])
    assert reference.status == "ok", reference.reason
    monkeypatch.setenv(UNCHECKED_ENV, ",".join(TRAINING_CHECKS))
    r = referee.judge(pipeline.run_one(f"lying_{lie}", scn, RunOptions(root=root), data=data, machine=CPU), reference, scn)
    assert passed_but_for_load(r), r.reason  # every other check passes: only the training checks tell
    monkeypatch.delenv(UNCHECKED_ENV)
    assert losses.scheme_of(r) == losses.scheme_of(reference) == "step_token_mean"
    judged = r.model_copy(update={"checks": [c for c in r.checks if c.name not in TRAINING_CHECKS]}, deep=True)
    referee.judge(judged, reference, scn)
    checks = {c.name: c for c in judged.checks}
    if lie == "honest":
        assert passed_but_for_load(judged), judged.reason
        assert checks["parity"].status == checks["update_parity"].status == "pass", judged.reason
        assert checks["update_parts"].status == "pass", checks["update_parts"].detail
    else:
        assert judged.status == "invalid", (lie, checks["parity"].detail, checks["update_parity"].detail)
        assert checks["update_parity"].status == "fail", checks["update_parity"].detail


def test_a_job_names_the_loss_scheme_and_older_job_files_read_none(tmp_path):
    """The Job fields a second reference run is started with (`loss_scheme`, `labels_rolled`):
    validated by the host, read by the worker SDK; a job file without them (an older host) reads
    None and False."""
    import pydantic

    from backend_helpers import make_job, tiny
    from framework_bench.worker.job import load_job

    job = make_job("torch", tmp_path, tiny())
    job.loss_scheme = "micro_mean_mean"
    assert load_job(job.write()).loss_scheme == "micro_mean_mean"
    older = json.loads(job.job_file.read_text())
    del older["loss_scheme"], older["labels_rolled"]
    job.job_file.write_text(json.dumps(older))
    assert load_job(job.job_file).loss_scheme is None and load_job(job.job_file).labels_rolled is False
    fields = {k: getattr(job, k) for k in ("backend", "scenario", "data_dir", "data_sha256", "run_dir")}
    assert type(job)(**fields, loss_scheme="step_label_mean").loss_scheme == "step_label_mean"
    with pytest.raises(pydantic.ValidationError):
        type(job)(**fields, loss_scheme="token sum")


def test_a_run_claiming_rolled_labels_needs_the_reference_trained_with_them(tmp_path, capsys):
    """A run whose settings ledger says it trained each row's labels rolled (ms-swift's sequence
    parallel) is judged against the reference trained so: the host asks for it, and so does a SLURM
    round's script on the node (`loss_weighting`'s key, a reference run prepared for it)."""
    from framework_bench.run.submit import judging_losses
    from framework_bench.worker import loss_weighting
    from framework_bench.worker.files import WORKER_REPORT
    from framework_bench.worker.loss_schemes import JudgingLoss

    def run(name: str, settings: dict) -> RunResult:
        (tmp_path / name).mkdir()
        (tmp_path / name / WORKER_REPORT).write_text(json.dumps({"settings": settings}))
        return RunResult(backend=name, scenario="s", status="ok", run_dir=tmp_path / name)

    rolled, reference = run("swift", {"labels_rolled": True}), run("torch", {})
    judging = run("torch-rolled", {"labels_rolled": True})
    assert needed_reference_loss(rolled, reference) == JudgingLoss(rolled=True)
    assert needed_reference_loss(rolled, judging) == needed_reference_loss(reference, reference) == JudgingLoss()
    assert JudgingLoss("step_label_mean", True).key == "step_label_mean+labels_rolled" and JudgingLoss().key == ""
    assert loss_weighting.main([str(reference.run_dir), str(rolled.run_dir), str(judging.run_dir)]) == 0
    assert capsys.readouterr().out.split() == ["labels_rolled"]
    # a SLURM round prepares the rolled reference under sequence parallel only
    assert JudgingLoss(rolled=True) in judging_losses(scenario.load("multiproc_tiny_cpu_sp2"))
    assert not any(loss.rolled for loss in judging_losses(scenario.load("multiproc_tiny_cpu_1x2")))
