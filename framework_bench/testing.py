"""Backend conformance: a plugin run through a small scenario and every host verification.

`fbench check-backend NAME` prints these points; a plugin's own pytest can call them too:

    from framework_bench.testing import assert_conforms

    def test_my_backend_conforms(tmp_path):
        assert_conforms("mybackend", tmp_path)

Points: the run itself ends `ok`, then each check of `framework_bench/verify.py` (tokens per
step, step numbering, consumed rows, throughput agreement, parameter count, settings present).
Here a claim the plugin does not report (`unverified`) fails too: conformance means every
claim is made and holds.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from framework_bench import runner, scenario as scenarios_
from framework_bench.metrics import RunResult
from framework_bench.verify import Check

SCENARIO = "tiny_cpu"


class Conformance(BaseModel):
    backend: str
    scenario: str
    points: list[Check]
    result: RunResult

    @property
    def passed(self) -> bool:
        return all(p.status == "pass" for p in self.points)


def check_backend(backend: str, root: Path | None = None, scenario: str = SCENARIO,
                  settings_mode: str = "matched", timeout: float | None = 900) -> Conformance:
    """Run `backend` on `scenario` (the CPU conformance scenario by default) and judge each point."""
    scn = scenarios_.load(scenario)
    result = runner.run_one(backend, scn, root=root, timeout=timeout, settings_mode=settings_mode)
    run = Check(name="run", status="pass" if result.status == "ok" else "fail",
                detail=f"status {result.status}" + (f": {result.reason.strip().splitlines()[-1]}" if result.reason else ""))
    points = [run] + [c if c.status != "unverified" else c.model_copy(update={"status": "fail"}) for c in result.checks]
    if not result.checks:
        points.append(Check(name="checks", status="fail", detail="the run ended before the host could check it"))
    return Conformance(backend=backend, scenario=scn.name, points=points, result=result)


def assert_conforms(backend: str, root: Path | None = None, **kwargs) -> Conformance:
    """`check_backend` for pytest: fails naming every point that did not pass."""
    report = check_backend(backend, root, **kwargs)
    failed = [f"{p.name}: {p.detail}" for p in report.points if p.status != "pass"]
    assert not failed, f"{backend} does not conform on {report.scenario}:\n" + "\n".join(failed)
    return report
