"""Post-install fixes for the CPU flavour of the LLaMA-Factory env; run by the host as
`python -m fbench_llamafactory.env_fixups FLAVOUR` with the env's Python, after pip.

Why: llamafactory 0.9.5 requires torchvision and torchaudio, and PyPI's builds pinned to
torch 2.13.0 are CUDA builds whose native ops cannot load next to the CPU torch:
- torchvision fails at import (`operator torchvision::nms does not exist`). LLaMA-Factory
  never imports it, but transformers imports it when it is installed, so it is removed.
- torchaudio is imported unconditionally (llamafactory/data/mm_plugin.py), and its
  CUDA-linked libraries fail to load; with them moved aside it imports as pure Python
  (audio features are unused for text training).
The alternative (torch 2.14.1 with matching CUDA torchvision/torchaudio, no fix-up) costs
a 6.6 GB env instead of ~2.2 GB. On the cuda flavour there is nothing to fix.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

DISABLED = "disabled-cuda-build"


def _own(package: str) -> Path | None:
    """The package's folder if this env installed it; None if absent or seen through
    --system-site-packages (the machine's, which the fixups never edit)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return None
    folder = Path(spec.origin).parent
    return folder if folder.resolve().is_relative_to(Path(sys.prefix).resolve()) else None


def remove_torchvision() -> None:
    if _own("torchvision") is None:
        print("torchvision: not this env's own, left as it is")
        return
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "--yes", "--disable-pip-version-check", "torchvision"],
                   check=True)


def disable_torchaudio_libs() -> None:
    if importlib.util.find_spec("torchaudio") is None:
        raise SystemExit("torchaudio is not installed: llamafactory imports it, the install is incomplete")
    own = _own("torchaudio")
    if own is None:
        print("torchaudio: not this env's own, left as it is")
        return
    lib = own / "lib"
    aside = lib / DISABLED
    aside.mkdir(parents=True, exist_ok=True)
    for so in lib.glob("*.so"):
        so.rename(aside / so.name)
        print(f"moved {so.name} to {aside}")


def check_imports() -> None:
    """Fail the env creation now rather than at the first run."""
    subprocess.run([sys.executable, "-c", "import torchaudio, llamafactory.data.mm_plugin, llamafactory.train.tuner"],
                   check=True)


def main(flavour: str) -> None:
    if flavour == "cpu":
        remove_torchvision()
        disable_torchaudio_libs()
    check_imports()


if __name__ == "__main__":
    main(sys.argv[1])
