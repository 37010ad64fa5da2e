"""The torch reference worker with work moved out of the measured steps where the host's time
checks allow it: `python -m fbench_lying_moved JOB LIE` runs a lie as `fbench_lying_worker` runs
its own (each line replaced exactly once). Its plugins are `fbench_lying_backends.LyingBackend`s
running this module, registered with `register_through_entry_points(site, ENTRY_POINTS,
"fbench-lying-moved")`. Stdlib only at import: the plugins are made when an entry point asks for one.
"""

from __future__ import annotations

from fbench_lying_worker import BACKWARD, END, FORWARD, INITIAL, OPTIMIZER, plugins_of, run

MODULE = "fbench_lying_moved"
UPDATE = ("(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM), optimizer.step(), "
          "optimizer.zero_grad(set_to_none=True))")

MOVED: dict[str, list[tuple[str, str]]] = {
    # The whole run trained inside the warm-up steps: the first its own step (it holds the first
    # call's set-up), each later one a share of the rest, each under the `warmup` check's bound; the
    # measured steps run forward only and record the losses kept.
    "trained_across_warmup": [
        (INITIAL, INITIAL + "    kept, every = {}, list(job.batches(rows, dist.rank, dist.world_size))\n"
                            "    shares = [[1]] + [list(map(int, s)) for s in __import__('numpy').array_split(range(2, job.steps + 1), job.scenario.steps.warmup - 1)]\n"
                            "    def train(s, batch):\n"
                            "        divisors = loss_divisors(job.loss_scheme, [l for _, l in batch], summed_over_ranks(device))\n"
                            "        kept[s] = [model(input_ids=torch.from_numpy(i), labels=torch.from_numpy(l), num_items_in_batch=d).loss for (i, l), d in zip(batch, divisors)]\n"
                            f"        [loss.backward() for loss in kept[s]], {UPDATE}\n"),
        (FORWARD, "                        [train(s, every[s - 1]) for s in shares[step - 1]] if step <= len(shares) and i == 0 else None\n"
                  "                        with torch.no_grad(): train_model(input_ids=x) if step > len(shares) else None\n"
                  "                        share = loss = kept[step][i].detach()\n"),
        (BACKWARD, ""),
        (OPTIMIZER, ""),
    ],
    # The update (clipping, the optimizer step) of every other measured step, counted back from the
    # last one (its update after the host's last stamp), after the step's clock stopped: the median
    # step is one without it, and the time between the steps holds ceil(n/2) - 1 updates in n
    # steps, under the `gaps` check's share.
    "update_between_windows": [
        (OPTIMIZER, "        moved = step > job.scenario.steps.warmup and (job.steps - step) % 2 == 0\n"
                    f"        None if moved else {UPDATE}\n"),
        (END, END + f"        {UPDATE} if moved else None\n"),
    ],
}
ENTRY_POINTS = {f"lying_{lie}": f"{MODULE}:lying_{lie}" for lie in MOVED}


# one thread: a step's time follows its work on a machine shared with other work, where two
# threads wait on each other at every operator
__getattr__ = plugins_of(MODULE, MOVED, env={"OMP_NUM_THREADS": "1"})


if __name__ == "__main__":
    run(MOVED)
