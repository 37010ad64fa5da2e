"""Post-install fixes for the XTuner env, run by the host as `python -m fbench_xtuner.env_fixups FLAVOUR`.

CPU flavour only. PyPI's torchvision 0.28.0 (the only release pinned to torch 2.13) is a
CUDA build: on the CPU torch its C++ ops fail to load, and `import torchvision` then
dies in `torchvision/_meta_registrations.py`, whose `register_fake("torchvision::nms")`
and `("torchvision::qnms")` decorators need those ops ("operator torchvision::nms does not
exist"). XTuner imports torchvision unconditionally (xtuner/dataset/internvl_dataset.py)
though it never uses it for LLM training. The fix guards those two decorators behind
`torchvision.extension._has_ops()`, the same guard the file's own `register_meta` uses.
The CUDA flavour's torchvision loads its ops, so nothing is changed there.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

OPS = ("nms", "qnms")


def _decorator(op: str) -> str:
    return f'@torch.library.register_fake("torchvision::{op}")\n'


def _guarded(op: str) -> str:
    return (f'@(torch.library.register_fake("torchvision::{op}") '
            f"if torchvision.extension._has_ops() else (lambda fn: fn))\n")


def guard_torchvision_fake_ops() -> str:
    """Patch torchvision's meta registrations in place; idempotent. Returns what was done."""
    spec = importlib.util.find_spec("torchvision")  # finds the package without importing it
    if spec is None or spec.origin is None:
        return "torchvision not installed: nothing to do"
    path = Path(spec.origin).parent / "_meta_registrations.py"
    if not path.resolve().is_relative_to(Path(sys.prefix).resolve()):
        # The machine's torchvision, seen through --system-site-packages: never edited from here.
        return f"{path}: not this env's own torchvision, left as it is"
    text = original = path.read_text()
    for op in OPS:
        if _guarded(op) in text:
            continue
        if _decorator(op) not in text:
            raise SystemExit(f"{path}: no register_fake for torchvision::{op}; this torchvision needs a new fix")
        text = text.replace(_decorator(op), _guarded(op))
    if text == original:
        return f"{path}: already guarded"
    path.write_text(text)
    return f"{path}: guarded register_fake for {', '.join(OPS)}"


def main(flavour: str) -> None:
    if flavour != "cpu":
        print(f"{flavour} flavour: no fix needed")
        return
    print(guard_torchvision_fake_ops())
    # Prove the env now imports what the worker needs.
    import torchvision  # noqa: F401
    import xtuner

    print(f"torchvision and xtuner {xtuner.__version__} import")


if __name__ == "__main__":
    main(sys.argv[1])
