"""The torch reference worker with its training moved into a process of its own, started after
the host's clock began: `python -m fbench_lying_children JOB LIE` runs a lie as
`fbench_lying_worker` runs its own (each line replaced exactly once). Its plugins are
`fbench_lying_backends.LyingBackend`s running this module, registered with
`register_through_entry_points(site, ENTRY_POINTS, "fbench-lying-children")`. Stdlib only at
import: the plugins are made when an entry point asks for one.
"""

from __future__ import annotations

from fbench_lying_worker import BACKWARD, FORWARD, INITIAL, OPTIMIZER, plugins_of, run

MODULE = "fbench_lying_children"

CHILDREN: dict[str, list[tuple[str, str]]] = {
    # Once the initial seed is revealed, a forked child trains every step (one thread: OpenMP's pool
    # does not survive a fork) and hands over in a file its losses, its weights when the warm-up
    # ended and its final ones; the parent waits for it (reaping it) and runs every timed step
    # forward only, recording the child's losses, with the weights the warm-up's projection and
    # the update projection expect at each moment.
    "trains_in_child": [
        (INITIAL, INITIAL + "    os, kept_file, W = __import__('os'), job.run_dir / 'kept.pt', job.scenario.steps.warmup\n"
                            "    if os.fork() == 0:\n"
                            "        torch.set_num_threads(1)\n"
                            "        kept, warm = [], None\n"
                            "        for s, batch in enumerate(job.batches(rows, dist.rank, dist.world_size), start=1):\n"
                            "            divisors = loss_divisors(job.loss_scheme, [l for _, l in batch], summed_over_ranks(device))\n"
                            "            kept.append([model(input_ids=torch.from_numpy(i), labels=torch.from_numpy(l), num_items_in_batch=d).loss for (i, l), d in zip(batch, divisors)])\n"
                            "            [loss.backward() for loss in kept[-1]], torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM), optimizer.step(), optimizer.zero_grad(set_to_none=True)\n"
                            "            warm = {k: v.clone() for k, v in model.state_dict().items()} if s == W else warm\n"
                            "        torch.save(([[l.detach() for l in k] for k in kept], warm, model.state_dict()), kept_file), os._exit(0)\n"
                            "    os.wait()\n"
                            "    kept, warm, state = torch.load(kept_file)\n"
                            "    model.load_state_dict(warm)\n"),
        (FORWARD, "                        model.load_state_dict(state) if step == W + 1 and i == 0 else None\n"
                  "                        with torch.no_grad(): train_model(input_ids=x)\n"
                  "                        share = loss = kept[step - 1][i]\n"),
        (BACKWARD, ""),
        (OPTIMIZER, ""),
    ],
}
ENTRY_POINTS = {f"lying_{lie}": f"{MODULE}:lying_{lie}" for lie in CHILDREN}


__getattr__ = plugins_of(MODULE, CHILDREN)


if __name__ == "__main__":
    run(CHILDREN)
