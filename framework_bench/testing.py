"""Backend conformance: a plugin run through a small scenario and every host verification.

`fbench check-backend NAME` prints these points; a plugin's own pytest can call them too:

    from framework_bench.testing import assert_conforms

    def test_my_backend_conforms(tmp_path):
        assert_conforms("mybackend", tmp_path)

Points: the run itself ends `ok`, then each check of `framework_bench/measure/verify.py` (tokens per
step, step numbering, consumed rows, throughput agreement, parameter count, settings present,
initial weights). Here a claim the plugin does not report (`unverified`) fails too:
conformance means every claim is made and holds.

On the CPU conformance scenario parity is blocking too: the canonical loss of the backend at every
step against the reference's on the same rows and seed (`framework_bench/measure/losses.py`), on
`tiny_cpu`, a grad_accum 2 variant, a 2-process variant (with ZeRO-2 when the backend refuses
ZeRO 0 on several CPU processes, as XTuner does) and a LoRA point (`tiny_cpu_lora`: its
adapters' trainable count, base unchanged and adapters moved, a backend declaring no LoRA
`skipped`); beside each, the update projection against the
reference's (`framework_bench/measure/update.py`). A backend whose records show another loss
normalisation is judged against the reference trained that way (`Job.loss_scheme`); one no
reference can match stays `unverified`, which fails here. A variant the backend refuses is shown
`skipped (refused: ...)`.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from framework_bench.measure import losses, update
from framework_bench.run import compare, pipeline
from framework_bench.run.options import RunOptions
from framework_bench.spec import scenario as scenarios_
from framework_bench.measure.metrics import RunResult
from framework_bench.measure.verify import Check, unchecked

SCENARIO = "tiny_cpu"
TWO_PROCESSES = ("multiproc_tiny_cpu_1x2", "multiproc_tiny_cpu_zero2")  # the first the backend accepts
LORA = "tiny_cpu_lora"


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
    """Run `backend` on `scenario` (the CPU conformance scenario by default) and judge each point."""
    scn = scenarios_.load(scenario)
    result = pipeline.run_one(backend, scn, RunOptions(root=root, timeout=timeout, settings_mode=settings_mode))
    run = Check(name="run", status="pass" if result.status == "ok" else "fail",
                detail=f"status {result.status}" + (f": {result.reason.strip().splitlines()[-1]}" if result.reason else ""))
    off = unchecked()
    points = [run] + [c if c.status != "unverified" else c.model_copy(update={"status": "fail"})
                      for c in result.checks if c.name not in off]
    if not result.checks:
        points.append(Check(name="checks", status="fail", detail="the run ended before the host could check it"))
    # an interrupted run (Ctrl-C, SIGTERM) stops the conformance run: no reference, no variants
    if scenario == SCENARIO and "parity" not in off and result.status != "interrupted":
        points += parity_points(backend, scn, result, root, settings_mode, timeout)
    return Conformance(backend=backend, scenario=scn.name, points=points, result=result)


def parity_variants(scn: scenarios_.Scenario) -> list[tuple[str, list[scenarios_.Scenario]]]:
    """Per parity variant of the conformance scenario: (label, candidates); the first candidate the
    backend does not refuse is run (XTuner refuses ZeRO 0 on several CPU processes: ZeRO-2 then)."""
    accumulated = scn.model_copy(update={"name": f"{scn.name}_grad_accum2", "grad_accum": 2})
    return [("grad_accum 2", [accumulated]), ("2 processes", [scenarios_.load(n) for n in TWO_PROCESSES]),
            ("LoRA", [scenarios_.load(LORA)])]


def parity_points(backend: str, scn: scenarios_.Scenario, result: RunResult, root: Path | None, settings_mode: str,
                  timeout: float | None) -> list[Check]:
    def run(name: str, s: scenarios_.Scenario, loss_scheme: str | None = None) -> RunResult:
        return pipeline.run_one(name, s, RunOptions(root=root, timeout=timeout, settings_mode=settings_mode,
                                                    loss_scheme=loss_scheme))

    ref_name = compare.reference_backend()

    def against_reference(label: str, s: scenarios_.Scenario, own: RunResult) -> list[Check]:
        # ZeRO shards the optimizer, not the forward pass: the reference runs the same rows unsharded.
        ref_scn = s.model_copy(update={"zero_stage": 0})
        reference = own if backend == ref_name and s.zero_stage == 0 else run(ref_name, ref_scn)
        # A backend that normalises the loss otherwise (XTuner at grad_accum 2) is judged against the
        # reference trained its way, as a compare judges it (run/compare.py `_judging_reference`).
        if reference is not own and (scheme := losses.needed_reference_scheme(own, reference)):
            reference = run(ref_name, ref_scn, scheme)
        moved = update.parity(own, reference, s.precision, name=f"update parity ({label})")
        return [losses.parity(own, reference, s.precision, name=f"parity ({label})")] + ([moved] if moved else [])

    points = against_reference(scn.name, scn, result)
    for label, candidates in parity_variants(scn):
        for variant in candidates:
            own = run(backend, variant)
            if own.status != "unsupported":
                # the variant's own checks too: for LoRA the trainable count and the two update figures
                points += [c.model_copy(update={"name": f"{c.name} ({label})"}) for c in own.checks
                           if c.name in ("trainable", "update") and c.name not in unchecked()]
                points += against_reference(f"{label}: {variant.name}", variant, own)
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
