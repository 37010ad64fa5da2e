"""Backend conformance: a plugin run through a small scenario and every host verification.

`fbench check-backend NAME` prints these points; a plugin's own pytest can call them too:

    from framework_bench.testing import assert_conforms

    def test_my_backend_conforms(tmp_path):
        assert_conforms("mybackend", tmp_path)

Points: the run itself ends `ok`, then each check of `framework_bench/measure/verify.py` (tokens per
step, step numbering, consumed rows, throughput agreement, parameter count, settings present,
initial weights). Here a claim the plugin does not report (`unverified`) fails too:
conformance means every claim is made and holds.

On the CPU conformance scenario each run is judged in a round (`framework_bench/run/round.py`), as
every command judges one, against the reference's run on the same rows and seed: the
canonical loss at every step, the update projection and its delay, on `tiny_cpu`, a grad_accum 2
variant, a 2-process variant (with ZeRO-2 when the backend refuses ZeRO 0 on several CPU
processes, as XTuner does) and a LoRA point (`tiny_cpu_lora`: its adapters' trainable count, base
unchanged and adapters moved, a backend declaring no LoRA `skipped`). A backend whose records show
another loss normalisation is judged against the reference trained that way (`Job.loss_scheme`),
as a compare judges it; one no reference can match stays `unverified`, which fails here. A variant
the backend refuses is shown `skipped (refused: ...)`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from framework_bench.measure import machine_load
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check, unchecked
from framework_bench.plugins import registry as plugins
from framework_bench.run import design, pipeline, preflight
from framework_bench.run.options import RunOptions
from framework_bench.run.reference import reference_backend
from framework_bench.run.round import Round
from framework_bench.scenario import scenario as scenarios_

SCENARIO = "tiny_cpu"
TWO_PROCESSES = ("multiproc_tiny_cpu_1x2", "multiproc_tiny_cpu_zero2")  # the first the backend accepts
LORA = "tiny_cpu_lora"
# The referee's checks, named per variant in the points.
JUDGED = ("parity", "update_parity", "projection_delay", "fp32_twin")


class Conformance(BaseModel):
    backend: str
    scenario: str
    points: list[Check]
    result: RunResult

    @property
    def passed(self) -> bool:
        return all(p.status in ("pass", "skipped") for p in self.points)


def check_backend(backend: str, root: Path | None = None, scenario: str = SCENARIO,
                  settings_mode: str = "matched", timeout: float | None = 900) -> Conformance:
    """Run `backend` on `scenario` (the CPU conformance scenario by default) and judge each point.
    Raises `preflight.Refused` when a run folder's name would be too long."""
    scn = scenarios_.load(scenario)
    if problem := preflight.overlong_run_folder([backend, *filter(None, [reference_backend()])], [scn]):
        raise preflight.Refused(problem)
    # an older plugin's worker fills its trained weights at start-up: its reference runs start there too
    options = RunOptions(root=root, timeout=timeout, settings_mode=settings_mode,
                         pinned_seed=bool(design.older_than_reveal(plugins.backends(), [backend])))
    result = pipeline.run_one(backend, scn, options)
    off = unchecked()
    # an interrupted run (Ctrl-C, SIGTERM) stops the conformance run: no reference, no variants
    judged = scenario == SCENARIO and "parity" not in off and result.status != "interrupted"
    own = [c for c in result.checks if c.name not in off]
    judging = _judge(backend, scn, result, options) if judged else []
    run = Check(name="run", status="pass" if result.status == "ok" else "fail",
                detail=f"status {result.status}" + (f": {result.reason.strip().splitlines()[-1]}" if result.reason else ""))
    points = [run] + [conformance_point(c) for c in own]
    if not result.checks:
        points.append(Check(name="checks", status="fail", detail="the run ended before the host could check it"))
    if judged:
        points += judging + variant_points(backend, scn, options)
    return Conformance(backend=backend, scenario=scn.name, points=points, result=result)


def conformance_point(check: Check) -> Check:
    """A run's check as a conformance point: one it could not judge fails the backend, but a busy
    machine (`machine_load`) is not the backend's to answer for: said, skipped."""
    if check.name == machine_load.NAME and check.status == "fail":
        return check.model_copy(update={"status": "skipped", "detail": f"not the backend's: {check.detail}"})
    return check.model_copy(update={"status": "fail"}) if check.status == "unverified" else check


def parity_variants(scn: scenarios_.Scenario) -> list[tuple[str, list[scenarios_.Scenario]]]:
    """Per parity variant of the conformance scenario: (label, candidates); the first candidate the
    backend does not refuse is run (XTuner refuses ZeRO 0 on several CPU processes: ZeRO-2 then)."""
    accumulated = scn.model_copy(update={"name": f"{scn.name}_grad_accum2", "grad_accum": 2})
    return [("grad_accum 2", [accumulated]), ("2 processes", [scenarios_.load(n) for n in TWO_PROCESSES]),
            ("LoRA", [scenarios_.load(LORA)])]


def _judge(backend: str, s: scenarios_.Scenario, own: RunResult, options: RunOptions,
           label: str | None = None) -> list[Check]:
    """`own` judged in a round of `s` against the reference's run beside it (the reference backend's
    own run judged against itself); the referee's checks as points named for `label` (default: the scenario)."""
    ref_name = reference_backend()
    # The reference backend's own run is the round's reference, judged against itself (its twin and
    # projection delay still judge it); any other backend's is judged against the reference's run beside it.
    round_ = Round(s, options, reference=ref_name, absent=f"no reference backend is installed to judge {backend}",
                   judge_reference=backend == ref_name)
    round_.add(backend, own)
    if ref_name is not None and backend != ref_name:
        round_.run(ref_name)
    before = len(own.checks)
    round_.close()
    label = label or s.name
    points = [c.model_copy(update={"name": f"{c.name} ({label})"}) for c in own.checks[before:]
              if c.name in JUDGED and c.name not in unchecked()]
    if not points:  # no reference fit to judge: the referee said why in the reason
        points.append(Check(name=f"parity ({label})", status="fail", detail=f"not judged: {own.reason}"[:300]))
    return [p if p.status != "unverified" else p.model_copy(update={"status": "fail"}) for p in points]


def variant_points(backend: str, scn: scenarios_.Scenario, options: RunOptions) -> list[Check]:
    """Each variant's first accepted candidate, run and judged like the conformance scenario."""
    points = []
    for label, candidates in parity_variants(scn):
        for variant in candidates:
            own = pipeline.run_one(backend, variant, options)
            if own.status != "unsupported":
                # the variant's own checks too: for LoRA the trainable count and the two update figures
                points += [c.model_copy(update={"name": f"{c.name} ({label})"}) for c in own.checks
                           if c.name in ("trainable", "update") and c.name not in unchecked()]
                points += _judge(backend, variant, own, options, f"{label}: {variant.name}")
                break
        else:
            points.append(Check(name=f"parity ({label})", status="skipped",
                                detail=f"skipped (refused: {(own.reason or '').strip()})"))
    return points


def assert_conforms(backend: str, root: Path | None = None, **kwargs) -> Conformance:
    """`check_backend` for pytest: fails naming every point that did not pass."""
    report = check_backend(backend, root, **kwargs)
    failed = [f"{p.name}: {p.detail}" for p in report.points if p.status not in ("pass", "skipped")]
    assert not failed, f"{backend} does not conform on {report.scenario}:\n" + "\n".join(failed)
    return report
