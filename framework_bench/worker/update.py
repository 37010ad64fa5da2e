"""The update after training (worker side, torch): a projection that proves the weights moved
as the reference's did, without a weight file.

After the last step every rank calls `report(model, job)`. It waits for the projection seed,
which the host reveals (`RUN_DIR/projection_seed.json`, written by the host's clock watcher:
`framework_bench/measure/update.py`) only once every rank's last measured step has ended, so no
worker can know the vector while it trains. Then it projects (final - initial) weights onto
that seed's random vector:

    sum over every parameter element of (w_final - w_initial) * v,   v ~ N(0, 1) from
    (projection seed, canonical name, element index)

and, in the same pass, |w_final - w_initial| (the L2 norm over every parameter element): the
projection is ~N(0, |dw|^2) whatever the vector, so the host judges differences of projections
relative to the reference's |dw|, a scale that does not depend on the vector drawn.

`w_initial` is recomputed from the compare's seed (`initial_weights_worker.initial_values`, rounded to the
parameter's dtype as `fill` stored it), so nothing is kept from the start of training and an
element never updated adds 0 (or, rarely, one ulp: `measure.update.unmoved`). Tensors are shared out between ranks (each gathered
under ZeRO-3 or FSDP2, a collective every rank enters) and the sums all-reduced in float64; rank 0
writes `RUN_DIR/update_projection.json` ({"projection_seed", "projection", "norm", "seconds"};
"parts": the same two figures over each part of the model alone (`part_of`: embeddings, each
decoder layer, final norm, head, adapters), so the host sees every part move as the reference's,
a frozen one too small to show in the whole included; with LoRA adapters "adapters" and "base",
so the host sees the adapters moved and the frozen base did not).

`report_at_warmup_end(model, job, clock)` makes the same projection of the live weights once
more, when the warm-up ends: right after each rank's end line of the last warm-up step, onto a
vector whose seed the host reveals only when it sees those lines (`WARMUP_REVEAL_FILE`), before
the first measured step begins (`WARMUP_UPDATE_FILE`). The reference's weights there are its
warm-up's training alone; a worker that trained later steps inside the warm-up cannot match.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from framework_bench.worker.dist import dist_info
from framework_bench.worker.files import REVEAL_FILE, REVEAL_TIMEOUT, UPDATE_FILE, wait_for_seed
from framework_bench.worker.initial_weights_worker import (chunks, gathered, init_args, initial_values, revealed_initial_seed,
                                                           standard_normal, whole)
from framework_bench.worker.initial_weights_host import canonical_name, is_adapter, projection_key, starts_revealed

# The projection at the warm-up's end: the seed the host reveals once every rank ended the last
# warm-up step, and the worker's projection with it (read by `framework_bench/measure/update.py`).
WARMUP_REVEAL_FILE = "warmup_projection_seed.json"
WARMUP_UPDATE_FILE = "warmup_update_projection.json"


def wait_for_reveal(run_dir: str | Path, timeout: float = REVEAL_TIMEOUT, reveal_file: str = REVEAL_FILE) -> int | None:
    """The projection seed the host revealed (in `reveal_file`), or None when none came within `timeout`."""
    return wait_for_seed(Path(run_dir) / reveal_file, "projection_seed", timeout)


def part_of(name: str) -> str:
    """The part of the model a parameter belongs to, for the per-part figures: the adapters, the
    embeddings, one decoder layer, the final norm, the head, or other."""
    if is_adapter(name):
        return "adapters"
    canonical = canonical_name(name)
    if canonical.startswith("model.embed_tokens."):
        return "embeddings"
    if layer := re.match(r"model\.layers\.(\d+)\.", canonical):
        return f"layer {layer[1]}"
    if canonical.startswith("model.norm."):
        return "final norm"
    return "head" if canonical.startswith("lm_head.") else "other"


def project(model, seed: int, hf_config: dict, projection_seed: int, trained_seed: int | None = None,
            adapters: bool = False) -> dict[str, tuple[float, float]]:
    """{"all", each part of the model (`part_of`) and, with adapters, "base": ((final - initial
    weights) . v, |final - initial weights|)} over those parameters (tied ones once), summed over
    ranks. The trained tensors started from `trained_seed` (`starts_revealed`), where given."""
    import torch

    dist = dist_info()
    grouped = torch.distributed.is_available() and torch.distributed.is_initialized()
    share, ranks = (dist.rank, dist.world_size) if grouped else (0, 1)
    params = list(model.named_parameters())
    if not params:
        return {"all": (0.0, 0.0)}
    parts = sorted({part_of(name) for name, _ in params})  # every rank holds every name (ZeRO-3, FSDP2 too)
    # [projection, squared norm] of each part; on the parameters' device: a ZeRO-3 partition is on it too
    total = torch.zeros(len(parts), 2, dtype=torch.float64, device=params[0][1].device)
    with torch.no_grad():
        for i, (name, p) in enumerate(params):
            with gathered([p], modifier_rank=None):  # every rank gathers; one of them projects
                data = whole(p)  # every rank too: an FSDP2 shard's all-gather
                # A 4-bit base (QLoRA) cannot move: bitsandbytes stores packed bytes no optimizer
                # steps, and its dequantized values are not `fill`'s; the frozen rest of the
                # base (embeddings, norms, head) is projected as any weight.
                if i % ranks != share or getattr(p, "quant_state", None) is not None:
                    continue
                flat, key, args = data.reshape(-1), projection_key(projection_seed, name), init_args(p, hf_config)
                start = trained_seed if trained_seed is not None and starts_revealed(name, adapters) else seed
                part = total[parts.index(part_of(name))]
                for lo, idx in chunks(flat.numel(), flat.device):
                    initial = initial_values(idx, name, start, *args).to(p.dtype).to(torch.float64)
                    moved = flat[lo:lo + idx.numel()].to(torch.float64) - initial
                    part[0] += (moved * standard_normal(idx, key)).sum()
                    part[1] += (moved * moved).sum()
        if grouped and ranks > 1:
            torch.distributed.all_reduce(total)
    figures = lambda t: (float(t[0]), float(t[1]) ** 0.5)  # noqa: E731
    out = {"all": figures(total.sum(dim=0)), **{part: figures(total[i]) for i, part in enumerate(parts)}}
    if "adapters" in parts:
        out["base"] = figures(total[[i for i, part in enumerate(parts) if part != "adapters"]].sum(dim=0))
    return out


def report(model, job) -> None:
    """Every rank, after the last step, with the process group still up: wait for the host's
    projection seed, project, and (rank 0) write the result. Without a seed (no host watching
    the run) nothing is written: the host then says the claim is missing."""
    _project_revealed(model, job, REVEAL_FILE, UPDATE_FILE)


def report_at_warmup_end(model, job, clock, then: Callable[[float], None] = lambda seconds: None) -> None:
    """Every rank, once the model is set up, before the first step (after
    `initial_weights_worker.fill_revealed`): right after the last warm-up step's end line on
    `clock` (a `steps.ClockLines`: the step timer's), project the live weights as `report` does,
    onto the vector the host reveals when it sees that line on every rank, before the first
    measured step begins; then call `then` with the seconds that took (a trainer timing its whole
    run leaves them out). Nothing without warm-up steps."""
    warmup = job.scenario.steps.warmup
    if warmup:
        def project_now() -> None:
            started = time.monotonic()
            _project_revealed(model, job, WARMUP_REVEAL_FILE, WARMUP_UPDATE_FILE)
            then(time.monotonic() - started)

        clock.after_end(warmup, project_now)


def _project_revealed(model, job, reveal_file: str, claim_file: str) -> None:
    """Wait for the seed the host reveals in `reveal_file`, project, and (rank 0) write `claim_file`."""
    projection_seed = wait_for_reveal(job.run_dir, reveal_file=reveal_file)
    if projection_seed is None:
        print(f"fbench: no projection seed revealed in {REVEAL_TIMEOUT:.0f} s ({reveal_file}); the projection is "
              "not reported", file=sys.stderr)
        return
    started = time.monotonic()
    parts = project(model, job.seed, job.hf_config, projection_seed, revealed_initial_seed(job.run_dir),
                    adapters=bool(job.scenario.finetune.adapters))
    if dist_info().is_main:
        path = Path(job.run_dir) / claim_file
        tmp = path.with_suffix(".tmp")
        value, norm = parts.pop("all")
        base = parts.pop("base", None)
        whole_parts = {"adapters": parts["adapters"], "base": base} if base else {}
        tmp.write_text(json.dumps({"projection_seed": projection_seed, "projection": value, "norm": norm,
                                   **{part: {"projection": p, "norm": n} for part, (p, n) in whole_parts.items()},
                                   "parts": {part: {"projection": p, "norm": n} for part, (p, n) in parts.items()},
                                   "seconds": round(time.monotonic() - started, 3)}))
        tmp.replace(path)
