"""How far honest frameworks' update projections lie from the torch reference's:
the figures `framework_bench/measure/update.py` sets `PARITY_TOLERANCE` from.

    .venv/bin/python benchmarks/projection_spread.py --seeds 10 [--precision bf16 --context-length 128] [--grad-accum 2]
                     [--backends torch,xtuner,llamafactory]

Per seed (the compare's seed: initial weights and projection vector both change with it) the
torch reference runs `tiny_cpu`, then each other backend; a backend whose loss normalisation
differs from the reference's (`losses.needed_reference_scheme`) is held against a torch run
trained with that normalisation (`Job.loss_scheme`), as the host does. Printed per run:
|p - p_ref| / |dw_ref| (what the check judges now), |p - p_ref| / |p_ref| (what it judged before:
its scale is one random projection of the reference, ~N(0, |dw|^2)), the worst relative
difference of a step's canonical loss, and the worst of the first two. On a CPU whose bf16 is
slow, `--context-length 128` keeps a bf16 seed to minutes; XTuner refuses bf16 on CPU (its
AmpOptimWrapper). `FBENCH_UNCHECKED=warmup` where a short scenario's first step trips the warm-up
check (its compile and allocation are most of so short a run): the projection is what is read.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from framework_bench.data.packing import pack
from framework_bench.measure import losses
from framework_bench.plugins.contract import Machine
from framework_bench.run import pipeline
from framework_bench.run.options import RunOptions
from framework_bench.worker.hparams import SEED
from framework_bench.scenario import scenario

CPU = Machine(gpus=0, cpu_count=2)


def run(backend: str, scn, data, root: Path, seed: int, scheme: str | None = None):
    result = pipeline.run_one(backend, scn, RunOptions(root=root, seed=seed, loss_scheme=scheme), data=data, machine=CPU)
    update = next((c.figures for c in result.checks if c.name == "update" and c.status == "pass"), None)
    if result.status != "ok" or update is None:
        print(f"# {backend} seed {seed}: {result.status} {(result.reason or '')[:300]}", flush=True)
        return result, None
    return result, update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=SEED)
    ap.add_argument("--scenario", default="tiny_cpu")
    ap.add_argument("--precision", default=None, help="override the scenario's (bf16: autocast on this CPU)")
    ap.add_argument("--context-length", type=int, default=None, help="override the scenario's (bf16 on a CPU is slow)")
    ap.add_argument("--grad-accum", type=int, default=None, help="override the scenario's")
    ap.add_argument("--backends", default="torch,xtuner,llamafactory")
    args = ap.parse_args()
    scn = scenario.load(args.scenario)
    if args.precision:
        scn = scn.model_copy(update={"name": f"{scn.name}_{args.precision}", "precision": args.precision})
    if args.grad_accum:
        scn = scn.model_copy(update={"name": f"{scn.name}_grad_accum{args.grad_accum}", "grad_accum": args.grad_accum})
    if args.context_length:
        scn = scn.model_copy(update={"name": f"{scn.name}_{args.context_length}", "context_length": args.context_length})
    data = pack(scn, progress=False, say=lambda msg: None)
    root = Path(tempfile.mkdtemp(prefix="projection-spread-"))
    others = [b for b in args.backends.split(",") if b != "torch"]
    worst = {"norm": 0.0, "own": 0.0}
    print(f"# {scn.name} ({scn.precision}), runs under {root}", flush=True)
    print("seed backend scheme p p_ref |dw_ref| |p-p_ref|/|dw_ref| |p-p_ref|/|p_ref| worst-step-loss", flush=True)
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        references = {}
        reference, ref_update = run("torch", scn, data, root, seed)
        if ref_update is None:
            continue
        references[losses.scheme_of(reference)] = (reference, ref_update)
        for backend in others:
            result, update = run(backend, scn, data, root, seed)
            if update is None:
                continue
            needed = losses.needed_reference_scheme(result, reference) or losses.scheme_of(reference)
            if needed not in references:
                references[needed] = run("torch", scn, data, root, seed, scheme=needed)
            _, ref = references[needed]
            if ref is None:
                continue
            diff = abs(update["projection"] - ref["projection"])
            by_norm, by_own = diff / ref["norm"], diff / abs(ref["projection"])
            worst = {"norm": max(worst["norm"], by_norm), "own": max(worst["own"], by_own)}
            loss_off = max(losses.step_differences(result, references[needed][0]).values())
            print(f"{seed} {backend} {losses.scheme_of(result)} {update['projection']:.6e} {ref['projection']:.6e} "
                  f"{ref['norm']:.6e} {by_norm:.2e} {by_own:.2e} {loss_off:.2e}", flush=True)
    print(f"# worst |p-p_ref|/|dw_ref| {worst['norm']:.2e}; worst |p-p_ref|/|p_ref| {worst['own']:.2e}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
