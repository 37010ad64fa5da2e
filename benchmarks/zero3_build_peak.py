"""What each rank of a ZeRO-3 run holds once its framework built the model: tiny-llama widened
to 155M parameters (0.58 GiB in fp32, whole) over two CPU processes, multiproc_tiny_cpu_zero3
otherwise. Prints the worker's `built` record (rank 0's elements held against the whole model's,
its peak memory by then: resident, on CPU) and the run's status.

    .venv/bin/python benchmarks/zero3_build_peak.py [BACKEND]   (default swift; trl's workers record `built` too)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from framework_bench.run.options import RunOptions
from framework_bench.run.round import Round
from framework_bench.scenario import scenario

WIDE = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 16,
        "intermediate_size": 2816}


def main(backend: str = "swift") -> None:
    s = scenario.load("multiproc_tiny_cpu_zero3")
    s = s.model_copy(update={"name": "multiproc_wide_cpu_zero3",
                             "model": s.model.model_copy(update={"config": WIDE})})
    s = scenario.Scenario.model_validate(s.model_dump())  # the widened model checked as a scenario's
    with tempfile.TemporaryDirectory() as tmp:
        round_ = Round(s, RunOptions(root=Path(tmp), launcher="torchrun", timeout=1800), reference=None)
        r = round_.run(backend)
        round_.close()
        report = r.run_dir / "worker.json"
        built = json.loads(report.read_text()).get("built") if report.exists() else None
        print(f"{backend}: {r.status}; built: {built}")
        if built:
            print(f"held {built['elements_held'] / built['elements_whole']:.3f} of {built['elements_whole']:,} elements; "
                  f"peak resident memory by then {built['peak_bytes'] / 2**30:.2f} GiB")


if __name__ == "__main__":
    main(*sys.argv[1:])
