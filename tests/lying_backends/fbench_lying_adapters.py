"""The torch reference worker training smaller adapters than its ledger claims:
`python -m fbench_lying_adapters JOB LIE` runs a lie as `fbench_lying_worker` runs its own (each
line replaced exactly once). Its plugins are `fbench_lying_backends.LyingBackend`s running this
module, registered with `register_through_entry_points(site, ENTRY_POINTS, "fbench-lying-adapters")`.
Stdlib only at import: the plugins are made when an entry point asks for one.
"""

from __future__ import annotations

from fbench_lying_worker import BUILT, INITIAL, LEDGER, PARAMS, plugins_of, run

MODULE = "fbench_lying_adapters"

ADAPTERS: dict[str, list[tuple[str, str]]] = {
    # Trains the job's rank on q_proj and v_proj only, and reports the adapters the job asks for
    # (every linear of tiny_cpu_lora) from a second model built with them: its initial weights,
    # parameter count and ledger, which in native settings also claims dropout 0.1, so that the
    # referee judges its losses at step 1 only (where B is zero whatever the adapters).
    "claims_dropout": [
        (BUILT, "    targets, job.scenario.finetune.targets = job.scenario.finetune.targets, ['q_proj', 'v_proj']\n"
                + BUILT + "    job.scenario.finetune.targets = targets\n"
                '    claimed = from_config(job, device, attn_implementation="sdpa", dtype=torch.float32)\n'),
        (INITIAL, INITIAL + "    initial_weights_worker.fill_revealed(claimed, job, log.timer.clock)\n"),
        (PARAMS, "        param_count=settings.param_count(claimed),\n"),
        (LEDGER, "        settings={**settings_in_effect, **adapters.settings(claimed),\n"
                 "                  **({'lora_dropout': 0.1} if job.settings_mode == 'native' else {})},\n"),
    ],
}
ENTRY_POINTS = {f"lying_{lie}": f"{MODULE}:lying_{lie}" for lie in ADAPTERS}


__getattr__ = plugins_of(MODULE, ADAPTERS)


if __name__ == "__main__":
    run(ADAPTERS)
