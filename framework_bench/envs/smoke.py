"""The cuda flavour's smoke test, run inside a new env: what every GPU run needs, checked once.

DeepSpeed and flash-attn are optional (a scenario needing one is refused by its backend):
recorded as a version, "absent" or "import fails: ...", never required. Importing, not reading
metadata: an installed package that fails to import must not count as present.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

OPTIONAL_IMPORTS = ("deepspeed", "flash_attn")  # recorded by the smoke test, never required
SMOKE_TEST = """
import json, torch
out = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if out["cuda_available"]:
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    out["bf16_matmul"] = bool(torch.isfinite(a @ a).all())
    out["gpu"] = torch.cuda.get_device_name(0)
for name in ("deepspeed", "flash_attn"):  # OPTIONAL_IMPORTS
    try:
        out[name] = __import__(name).__version__
    except ModuleNotFoundError as e:
        out[name] = "absent" if e.name == name else "import fails: %s" % e
    except Exception as e:
        out[name] = "import fails: %s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def smoke_test(python: Path, gpu_here: bool) -> dict:
    """The check inside the env: CUDA available and a bf16 matmul on the GPU pass it; deepspeed's
    and flash-attn's state is recorded. Without a GPU here it is not run, and says so."""
    if not gpu_here:
        return {"status": "not run: no GPU here"}
    proc = subprocess.run([str(python), "-c", SMOKE_TEST], capture_output=True, text=True)
    if proc.returncode:
        return {"status": "failed", "error": proc.stderr.strip().splitlines()[-1:]}
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    ok = found["cuda_available"] and found.get("bf16_matmul")
    return {"status": "passed" if ok else "failed", **found}
