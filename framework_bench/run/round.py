"""The round: the unit of work, and its one owner.

A round is one scenario's runs that judge each other: the candidates in their rotated order, the
reference among them, and the runs that only judge (the reference trained as a run says it
trained: `reference.judging_reference`; every run's fp32 twin and the reference's: `twin.py`; a
native LoRA run's dropout twin and the reference's, in matched settings: `dropout_twin.py`).
Every command drives rounds: `compare` and `run` (`compare.py`), `check-backend`
(`framework_bench/testing.py`), the device check (`framework_bench/device/check.py`), and SLURM's
`results collect`, which resumes the round its submission wrote (`collect.py`). Only the round
calls the referee (`referee.judge`) and keeps a run (`pipeline.keep`), so a run passes or fails
the same checks whichever command ran it.

A reference that does not declare the scenario's ZeRO stage judges through a run of it at ZeRO 0
(ZeRO shards states, not the forward pass or the update), made once per round.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from framework_bench.measure.metrics import RunResult
from framework_bench.plugins import registry as plugins
from framework_bench.run import dropout_twin, pipeline, readback, referee, sealing, twin
from framework_bench.run.options import RunOptions, Trial
from framework_bench.run.reference import judging_reference
from framework_bench.scenario.scenario import Scenario
from framework_bench.store.results import ResultStore
from framework_bench.worker.loss_schemes import JudgingLoss

class JudgingRuns:
    """How a round makes (or reads back) the runs that only judge, each once: `backend`'s run of
    `trained`, the reference's with the judging loss `loss` (the default: its own), in the round's settings
    or `settings_mode` (a dropout twin's: matched). `interrupted`: the round was, so none starts;
    `stopped`: the judging runs that were interrupted (the command ends with the round)."""

    def __init__(self):
        self.stopped: list[RunResult] = []
        self.interrupted = False

    def __call__(self, backend: str, trained: Scenario, loss: JudgingLoss, settings_mode: str | None = None) -> RunResult:
        raise NotImplementedError


class LocalRuns(JudgingRuns):
    """Judging runs started here, with the round's options, never stored; none starts once a run
    was interrupted."""

    def __init__(self, options: RunOptions):
        super().__init__()
        self.options = options

    def __call__(self, backend: str, trained: Scenario, loss: JudgingLoss, settings_mode: str | None = None) -> RunResult:
        if self.interrupted or self.stopped:
            return RunResult(backend=backend, scenario=trained.name, status="interrupted",
                             reason="the round was interrupted before it ran")
        mode = {"settings_mode": settings_mode} if settings_mode else {}
        result = pipeline.run_one(backend, trained, self.options.trained_with(loss, db=None, **mode))
        if result.status == "interrupted":
            self.stopped.append(result)
        return result


class Round:
    """One round of `scenario`: its runs in `order` (`run` each, or `add` what did not run), then
    `close`: the reference kept first, the twins run, each other run judged and kept.

    `reference`: the reference backend's name (None: none judges, `absent` says why).
    `store`: where runs are kept (None: result.json only). `judging`: how judging runs are made
    (default: here, `LocalRuns`). `judge_reference`: the reference's own run is judged too, against
    itself (a conformance check of the reference backend)."""

    def __init__(self, scenario: Scenario, options: RunOptions, *, reference: str | None, absent: str = "none was run",
                 order: list[str] | None = None, store: ResultStore | None = None, judging: JudgingRuns | None = None,
                 compare_id: str | None = None, number: int | None = None, manifest: dict | None = None,
                 judge_reference: bool = False,
                 on_kept: Callable[[Path], None] = lambda path: None,
                 on_result: Callable[[RunResult, Scenario], None] = lambda r, s: None):
        self.scenario, self.options, self.reference, self.absent = scenario, options, reference, absent
        self.order, self.store, self.manifest = list(order or []), store, manifest
        self.judging = judging or LocalRuns(options)
        self.compare_id, self.number, self.judge_reference = compare_id, number, judge_reference
        self.on_kept, self.on_result = on_kept, on_result
        self.reference_run: RunResult | None = None
        self.pending: list[RunResult] = []  # the candidates, judged at `close`
        self._sealed: sealing.Sealed | None = None
        self._made: dict[tuple, RunResult] = {}  # judging runs, once each per round

    @property
    def stopped(self) -> bool:
        """A judging run was interrupted: nothing more runs after this round."""
        return bool(self.judging.stopped)

    def run(self, name: str, on_step: readback.StepCallback = lambda done, total, secs: None,
            timeout: float | None = None) -> RunResult:
        """Run `name`'s trial of the round here; a reference with runs after it in the order is held
        off the disk until `close` (`sealing`)."""
        options = self.trial_options(name)
        options = options if timeout is None else options.model_copy(update={"timeout": timeout})
        result = self.add(name, pipeline.run_one(name, self.scenario, options, on_step=on_step))
        position = result.trial_position
        if (name == self.reference and position is not None and position < len(self.order)
                and result.run_dir is not None and result.run_dir.is_dir()):
            self._sealed = sealing.seal(result.run_dir)  # out of reach of the runs after it
        return result

    def trial(self, name: str) -> Trial:
        """`name`'s trial of the round: the compare, the round, its place in the round's order."""
        return Trial(compare_id=self.compare_id, trial_round=self.number,
                     trial_position=self.order.index(name) + 1 if name in self.order else None)

    def trial_options(self, name: str) -> RunOptions:
        """The round's options for `name`'s run, naming its trial (its claim records it: `orphans.claim`)."""
        return self.options.model_copy(update={"trial": self.trial(name)})

    def add(self, name: str, result: RunResult) -> RunResult:
        """A trial of the round that ended (or never ran: a refusal), tagged with the round."""
        for field, value in self.trial(name):  # compare_id, trial_round, trial_position
            setattr(result, field, value)
        if name == self.reference:
            self.reference_run = result
        else:
            self.pending.append(result)
        return result

    def close(self, interrupted: bool = False, why: str | None = None) -> None:
        """The round's runs have ended: the reference's folder back on the disk and kept, then every
        fp32 twin (the backends' before the reference's: no twin runs beside a reference twin's
        files), then each other run judged against the reference and kept. `interrupted`: no
        judging run starts; what needs one stays `unverified`, saying `why`."""
        self.judging.interrupted = self.judging.interrupted or interrupted
        lost = self._sealed.restore() if self._sealed is not None else None  # a full disk: no folder to judge by
        self._sealed = None
        reference, self.reference_run = self.reference_run, None
        if reference is not None:
            if lost:
                reference.notes.append(lost)
            elif self.judge_reference:
                self.judge(reference, reference)
            self.conclude(reference)
        if lost:
            reference = None
        if reference is not None and reference.status in ("ok", "unverified") and not interrupted:
            for result in self.pending:
                if (twin_scenario := twin.twin_of(self.scenario)) and result.status in ("ok", "unverified"):
                    self._judging_run(result.backend, twin_scenario, JudgingLoss())
                dropout_scenario = dropout_twin.twin_of(self.scenario, result)
                if isinstance(dropout_scenario, Scenario) and result.status in ("ok", "unverified"):
                    self._judging_run(result.backend, dropout_scenario, JudgingLoss(), dropout_twin.SETTINGS_MODE)
        absent = lost or why or self.absent
        while self.pending:
            result = self.pending.pop(0)
            self.judge(result, reference, absent)
            self.conclude(result)

    def judge(self, result: RunResult, reference: RunResult | None, absent: str | None = None) -> RunResult:
        """`result` judged by the referee against `reference` (the round's reference run), through the
        judging runs it needs."""
        return referee.judge(result, self.judging_reference(result, reference), self.scenario,
                             absent or self.absent, self._judging_run)

    def judging_reference(self, result: RunResult, reference: RunResult | None) -> RunResult | None:
        """The reference run `result` is judged against: the round's, at ZeRO 0 where the reference
        cannot shard as the scenario asks, trained as `result` says it trained."""
        if reference is not None and reference.status == "unsupported" and self.scenario.zero_stage and \
                self.reference and self.scenario.zero_stage not in \
                plugins.get(self.reference).info.capabilities.zero_stages:
            unsharded = self.scenario.model_copy(update={"zero_stage": 0})
            reference = self._judging_run(self.reference, unsharded, JudgingLoss())
            result.notes.append(f"judged against a run of {reference.backend} at ZeRO 0, which it runs in place of "
                                f"ZeRO {self.scenario.zero_stage} ({reference.status}; not stored, not a trial: "
                                f"{reference.run_dir})")
        if reference is None:
            return None
        return judging_reference(result, reference, self.scenario,
                                 lambda trained, loss: self._judging_run(reference.backend, trained, loss), {})

    def _judging_run(self, backend: str, trained: Scenario, loss: JudgingLoss,
                     settings_mode: str | None = None) -> RunResult:
        """A run that judges (`twin.RunTwin`), once per round, in the round's settings or, where they
        differ, `settings_mode` (a dropout twin's, and the reference's run judging it: matched)."""
        other = settings_mode if settings_mode not in (None, self.options.settings_mode) else None
        key = (backend, trained.model_dump_json(), loss, other)
        if key not in self._made:
            self._made[key] = self.judging(backend, trained, loss, other)
        return self._made[key]

    def conclude(self, result: RunResult) -> RunResult:
        """The end of a run's life (`pipeline.keep`): stored, or kept in a file the next command stores."""
        if kept := pipeline.keep(self.store, result, self.scenario, self.manifest):
            self.on_kept(kept)
        self.on_result(result, self.scenario)
        return result
