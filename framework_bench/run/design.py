"""The design of a compare's trials: the order of each round's runs, the warm-up rounds, how
many rounds `--repeat auto` may take, and each round's seed."""

from __future__ import annotations

import hashlib
import os
import secrets
import time

from framework_bench.scenario.scenario import Scenario

PINNED_SEED_NOTE = ("seed pinned with --seed: every compare with it starts from these initial weights, so a run "
                    "replaying an earlier compare's results, or training before its first step, is not excluded")


def older_than_reveal(backends: dict, names: list[str]) -> list[str]:
    """Of `names`, the backends (`plugins.backends()`) whose plugin contract predates the initial
    seed's reveal: their workers fill the trained weights at start-up from the job's seed."""
    from framework_bench.measure.verify import claimed_since

    return [n for n in names if backends.get(n) is not None and backends[n].info.contract < claimed_since("initial_reveal")]


def older_plugin_note(names: list[str]) -> str:
    """The note of every run of a compare beside an older plugin (`older_than_reveal`): all of them
    start from the compare's seed, so that one can be judged against the reference."""
    return (f"beside {', '.join(names)} (a plugin of a contract before the initial seed's reveal) every run starts "
            "from the compare's seed, so training before its first step is not excluded")


def compare_seed(pinned: int | None) -> int:
    """The seed a compare starts from: the one pinned with `--seed`, else a fresh one, so that no
    run can replay what it trained in an earlier compare (the same weights and rows)."""
    return secrets.randbelow(2**32) if pinned is None else pinned


def new_compare_id() -> str:
    """The id every trial of one compare is stored with: its start and the process."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def round_seed(seed: int, index: int) -> int:
    """The seed of a compare's `index`-th round (0: its first, warm-up rounds included), shared by
    every backend of the round: the compare's own, then one derived from it per round."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}/{index}".encode(), digest_size=4).digest(), "big")

# `--repeat auto`: rounds until every pair's interval is narrow enough. It judges only from
# AUTO_MIN_ROUNDS on (with fewer trials a side the bootstrap's intervals are too narrow, so an early
# stop would trust the luckiest rounds: docs/calibration.md), and stops at AUTO_MAX_ROUNDS whatever
# the width (a noisy machine would otherwise never end).
AUTO_MIN_ROUNDS = 5
AUTO_MAX_ROUNDS = 10


def trial_orders(backend_names: list[str], reference_name: str | None, reference_last: bool = False) -> list[list[str]]:
    """The orders of successive rounds: a Williams design (`round_orders`) over the backends and
    the reference (when there is one), which comes last in the first round's order and takes
    every place in turn after, so that its place and its backend are not confounded. A round
    judges its runs once all have ended; a reference run before others is held off the disk
    until then (`framework_bench/run/sealing.py`), so no run can read its loss curve or update
    projection. `reference_last`: the design over the others, the reference last in every round
    (a SLURM job runs its round on the nodes, where the host cannot hold a folder)."""
    others = [b for b in dict.fromkeys(backend_names) if b != reference_name]
    if reference_name is None or reference_last:
        orders = round_orders(others) or [[]]
        return [order + [reference_name] for order in orders] if reference_name else orders
    rows = round_orders(others + [reference_name])
    # Relabelled so that the reference is last in the first round: a single round (and every
    # compare's first) needs nothing held off the disk. Relabelling keeps the design balanced.
    swap = {reference_name: rows[0][-1], rows[0][-1]: reference_name}
    return [[swap.get(b, b) for b in row] for row in rows]


def round_orders(backends: list[str]) -> list[list[str]]:
    """The orders of successive rounds, cycled: a Williams design (a Latin square balanced for
    what runs just before), so that over its rows each backend runs in each place equally often
    and right after each other backend once; an odd count needs the mirrored rows too. Its first
    row is `backends` first, then alternately from the end: 0, 1, k-1, 2, k-2, ..."""
    k = len(backends)
    first = [0] + [(j + 1) // 2 if j % 2 else k - j // 2 for j in range(1, k)]
    rows = [[(i + r) % k for i in first] for r in range(k)]
    if k % 2 and k > 1:
        rows += [row[::-1] for row in rows]
    return [[backends[i] for i in row] for row in rows]


def warmup_default(repeat: int, scenario: Scenario) -> int:
    """One warm-up round when a CPU scenario is repeated: the first runs after start-up pay for
    cold caches (docs/calibration.md); it costs one more run per backend."""
    return 1 if repeat >= 2 and scenario.cluster.device == "cpu" else 0


def round_range(repeat: int | str) -> tuple[int, int]:
    """The fewest and the most counted rounds `repeat` asks for (`auto`: AUTO_MIN_ROUNDS to AUTO_MAX_ROUNDS)."""
    return (AUTO_MIN_ROUNDS, AUTO_MAX_ROUNDS) if repeat == "auto" else (int(repeat), int(repeat))
