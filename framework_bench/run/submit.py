"""`--launcher slurm`: runs prepared as `framework_bench/run/pipeline.py` prepares every run, then
handed to SLURM a round at a time (`submit_all`): one batch job per round runs that round's
backends one after another on the same nodes, in the rotated order a compare here runs them, the
reference last, and after it any reference run needed to judge a run trained otherwise.
`framework_bench/run/collect.py` finishes each run when its job ends.

`--repeat N` makes N rounds, N jobs: a round shares one allocation (its runs are paired on the
same nodes, as `measure/statistics.py` pairs a round's runs), while rounds queue apart, so that
one lost node costs one round and each job's time limit stays that of one round."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins.contract import Machine
from framework_bench.run import design, orphans, pipeline, refusals, twin
from framework_bench.run.interrupts import held
from framework_bench.run.launchers.base import Submission
from framework_bench.run.launchers.slurm import SBATCH_FILE, round_runs, twin_key
from framework_bench.run.launchers.slurm_time import TimeEstimate
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import reference_backend
from framework_bench.run.round import Round
from framework_bench.store.results import ResultStore
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker.loss_schemes import MICRO_MEAN_MEAN, SCHEMES, WORLD_LABEL_MEAN, JudgingLoss


class Planned(BaseModel):
    """One backend x scenario for SLURM: refused or failed (result), or written (and maybe submitted)."""

    refusals: refusals.Refusals
    result: RunResult | None = Field(None, description="the unsupported or failed result: nothing submitted")
    sbatch: Path | None = None
    time: TimeEstimate | None = None
    submission: Submission | None = None
    note: str | None = None


def judging_losses(scenario: Scenario) -> list[JudgingLoss]:
    """The losses a run of `scenario` can train apart from the reference's own: the loss
    normalisations it can show (micro-batch means only with accumulation, every process's labels
    only with several), each with its labels rolled or not (rolled only under sequence parallel).
    A round's reference is prepared to train with each, and trains with those its runs showed."""
    schemes = [None] + [s for s in SCHEMES if (s != MICRO_MEAN_MEAN or scenario.grad_accum > 1)
                        and (s != WORLD_LABEL_MEAN or scenario.cluster.gpus > 1)]
    rolled = (False, True) if scenario.sequence_parallel > 1 else (False,)
    return [JudgingLoss(s, r) for r in rolled for s in schemes if s or r]


def submit_round(round_: Round, on_planned: Callable[[str, Scenario, Planned], None],
                 machine: Machine | None = None) -> None:
    """Prepare the round's runs in its order (the reference last) and submit them as one job. A
    backend that refused, or whose hooks raised, is a result at once, kept by the round, and never
    submitted. Each submitted run records the reference's run folder and the judging runs'
    (the reference prepared with each loss a run may train), and is judged against
    them when collected (`collect.resumed`). Nothing is started when no run is left.

    Ctrl-C while the round is prepared or submitted: a job sbatch took is handed over all the same
    (every run of it recorded, as the trial it is, for `results collect`); runs no job took are kept
    `interrupted` by the round; then the KeyboardInterrupt goes on."""
    scenario, reference_name = round_.scenario, round_.reference
    prepared: list[pipeline.Prepared] = []
    refused: list[tuple[str, Planned]] = []
    judging: dict[str, pipeline.Prepared] = {}
    subs: list[Submission] | None = None
    try:
        for name in round_.order:
            heard: list[refusals.Refusals] = []
            p = pipeline.prepare(name, scenario, round_.trial_options(name), machine=machine, on_refusals=heard.append)
            if isinstance(p, RunResult):
                refused.append((name, Planned(refusals=heard[0] if heard else refusals.Refusals(backend=name, check=p.reason),
                                              result=round_.add(name, p))))
                if p.status == "interrupted":  # Ctrl-C while packing: nothing more is prepared
                    raise KeyboardInterrupt
            else:
                prepared.append(p)
        reference = prepared[-1] if prepared and prepared[-1].identity.backend == reference_name else None
        if reference is not None and len(prepared) > 1:
            judging.update(_judging_runs(round_, reference, scenario, judging_losses(scenario), machine))
            if twin_scenario := twin.twin_of(scenario):  # every run's fp32 twin, in the same job
                for p in prepared:
                    judging.update(_judging_runs(round_, p, twin_scenario, [JudgingLoss()], machine,
                                                 twin_key(p.identity.backend)))
                if twin_key(reference.identity.backend) in judging:
                    judging.update(_judging_runs(round_, reference, twin_scenario, judging_losses(twin_scenario),
                                                 machine, twin_key(reference.identity.backend) + "/"))
        if prepared:
            subs = prepared[0].executor.submit_round([(p.plan, p.job) for p in prepared],
                                                     {k: (p.plan, p.job) for k, p in judging.items()},
                                                     round_.options, prepared[0].gpu_name)
    except KeyboardInterrupt:
        with held(reraise=False):  # a second Ctrl-C must not leave the round half recorded
            _handed_over(round_, prepared, judging, _taken(prepared), refused, on_planned)
        raise
    with held():  # each run's folder records its job before Ctrl-C can stop the command
        _handed_over(round_, prepared, judging, subs, refused, on_planned)


def _judging_runs(round_: Round, run: pipeline.Prepared, scenario: Scenario, trained: list[JudgingLoss],
                  machine: Machine | None, key: str = "") -> dict[str, pipeline.Prepared]:
    """`run`'s backend prepared on `scenario` with each judging loss, as runs that only judge (never
    stored), by `key` + the loss's key; one refused is left out (its judging reads it as not run)."""
    made = {}
    for loss in trained:
        p = pipeline.prepare(run.identity.backend, scenario, round_.options.trained_with(loss), machine=machine)
        if isinstance(p, RunResult):  # never stored: not a trial
            orphans.release(p.run_dir)
            if p.status == "interrupted":
                raise KeyboardInterrupt
        else:
            made[key + loss.key] = p
    return made


def _taken(prepared: list[pipeline.Prepared]) -> list[Submission] | None:
    """The round's submissions where a Ctrl-C stopped its submission after sbatch took the job: one
    job for all its runs, recorded (`slurm.json`) in the folders written before the interrupt, the
    others' made from one of them; None where no job was taken."""
    for p in prepared:
        try:
            sub = Submission.load(p.job.run_dir)
        except (OSError, ValueError):  # not written, or cut by the interrupt
            continue
        if sub.job_id is not None:
            return [sub.model_copy(update={"backend": q.identity.backend, "run_dir": q.job.run_dir}) for q in prepared]
    return None


def _handed_over(round_: Round, prepared: list[pipeline.Prepared], judging: dict[str, pipeline.Prepared],
                 subs: list[Submission] | None, refused: list[tuple[str, Planned]],
                 on_planned: Callable[[str, Scenario, Planned], None]) -> None:
    """The round's runs given up by this command: the round closed (its `refused` kept), then each
    run `subs` holds recorded as its trial of the round, with the reference's run folder and the
    judging runs' it is judged by when collected; without `subs` (no job taken: a Ctrl-C) each
    kept `interrupted`. Every claim released."""
    for p in judging.values():
        orphans.release(p.job.run_dir)  # a judging run is never stored: its candidate's notes name it
    if subs is None:
        for p in prepared:
            # No job took it: a job sbatch took while it was stopped is never collected (`collect.pending`).
            (p.job.run_dir / SBATCH_FILE).unlink(missing_ok=True)
            round_.add(p.identity.backend, p.identity.result(
                "interrupted", run_dir=p.job.run_dir, data_sha256=p.job.data_sha256,
                reason="interrupted before its round's job was submitted"))
    round_.close(interrupted=subs is None)  # the refusals (and runs never submitted) kept
    for name, planned in refused:
        on_planned(name, round_.scenario, planned)
    if not subs:
        return
    reference = prepared[-1] if prepared[-1].identity.backend == round_.reference else None
    time = prepared[0].executor.time_limit(round_.scenario, prepared[0].gpu_name,
                                           round_runs(len(prepared), list(judging)))
    for p, sub in zip(prepared, subs):
        for field, value in round_.trial(p.identity.backend):  # compare_id, trial_round, trial_position
            setattr(sub, field, value)
        if reference is not None and p is not reference:
            sub.reference = reference.job.run_dir
            sub.judging = {scheme: j.job.run_dir for scheme, j in judging.items()}
        if sub.job_id is not None:
            sub.save()
        orphans.release(p.job.run_dir)  # its job is `results collect`'s to store now
        on_planned(p.identity.backend, round_.scenario, Planned(
            refusals=p.refusals, sbatch=p.job.run_dir / SBATCH_FILE, time=time,
            submission=sub if sub.job_id else None, note=sub.note))


def submit_all(
    scenarios: list[Scenario],
    backend_names: list[str],
    options: RunOptions,
    store: ResultStore | None,
    *,
    repeat: int = 1,
    no_reference: bool = False,
    on_scenario: Callable[[Scenario], None] = lambda s: None,
    on_round: Callable[[Scenario, int, list[str]], None] = lambda s, i, order: None,
    on_planned: Callable[[str, Scenario, Planned], None] = lambda b, s, p: None,
    on_kept: Callable[[Path], None] = lambda path: None,
) -> None:
    """`compare --launcher slurm`: on every scenario, `repeat` rounds, each one job
    (`submit_round`; what is refused is stored in `store` at once): the backends in the order of `design.trial_orders` (rotated round after
    round), the reference added and last unless `no_reference` (its files stay on the node's
    disk, where the runs after it could read them). Each round has its own seed,
    derived from the compare's (`design.round_seed`), as a compare here has."""
    options = options.model_copy(update={"launcher": "slurm"})
    reference_name = None if no_reference else reference_backend()
    orders = design.trial_orders(backend_names, reference_name, reference_last=True)
    seed, compare_id = design.compare_seed(options.seed), design.new_compare_id()
    for s in scenarios:
        on_scenario(s)
        for i in range(repeat):
            order = orders[i % len(orders)]
            on_round(s, i + 1, order)
            submit_round(Round(s, options.model_copy(update={"seed": design.round_seed(seed, i)}),
                               reference=reference_name, order=order, store=store, compare_id=compare_id,
                               number=i + 1, on_kept=on_kept), on_planned)
