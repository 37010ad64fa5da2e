"""The torch reference worker with a recipe of bf16's own: the lie applies in bf16 only, the loop is
honest in fp32, so in its fp32 twin. `python -m fbench_lying_recipes JOB LIE` runs a lie as
`fbench_lying_worker` runs its own (each line replaced exactly once);
its plugins are `fbench_lying_backends.LyingBackend`s running this module, registered with
`register_through_entry_points(site, ENTRY_POINTS, "fbench-lying-recipes")`. Stdlib only at
import: the plugins are made when an entry point asks for one.
"""

from __future__ import annotations

from fbench_lying_worker import plugins_of, run

MODULE = "fbench_lying_recipes"
CLIP = "        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)\n"
LEDGER_CLIP = "        grad_clip=MAX_GRAD_NORM, sequence_parallel=sp,\n"

RECIPES: dict[str, list[tuple[str, str]]] = {
    # No gradient clipping in bf16 (a recipe of its own for bf16), the ledger saying so.
    "bf16_no_clipping": [
        (CLIP, CLIP.replace("        ", "        None if bf16 else ", 1)),
        (LEDGER_CLIP, LEDGER_CLIP.replace("grad_clip=MAX_GRAD_NORM", "grad_clip=None if bf16 else MAX_GRAD_NORM")),
    ],
}
ENTRY_POINTS = {f"lying_{lie}": f"{MODULE}:lying_{lie}" for lie in RECIPES}


__getattr__ = plugins_of(MODULE, RECIPES)


if __name__ == "__main__":
    run(RECIPES)
