"""What every chart shares: its wording (contexts, machines, GPU counts, series names), its
colours and rc settings, the context axis, and how a figure is saved.

matplotlib is imported inside the functions that draw only (so `fbench --help` stays fast),
and figures are drawn on a bare `Figure` (Agg, no pyplot state).
"""

from __future__ import annotations

import re
from pathlib import Path

from framework_bench.plugins import registry

DEFAULT_OUT = Path("plots")
METRICS = (("tgs", "tokens / s / GPU (TGS)"), ("tflops", "TFLOPs / GPU (XTuner formula)"))
METHODS = {"full": "full", "lora": "LoRA", "qlora": "QLoRA"}  # in the order they are drawn
# Fixed so committed SVGs only change when the picture does.
RC = {"svg.hashsalt": "fbench", "font.size": 10}
_SAVE_META = {"png": {"Software": None}, "svg": {"Date": None}}


def ctx_label(n: int) -> str:
    """512, 1k, 8k, 128k, 1M: binary multiples, as the published table writes them."""
    for div, suffix in ((1024 * 1024, "M"), (1024, "k")):
        if n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def slug(text: str) -> str:
    """`text` as a file name or SVG gid part."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "x"


def hardware(rows: list[dict]) -> str:
    """The machines the rows ran on, from their manifests (this machine when there are none)."""
    machines = [r["manifest"] for r in rows if r.get("manifest")]
    if not machines:
        from framework_bench.measure.machine import detect
        m = detect()
        machines = [{"gpu": m.gpu_name, "gpu_count": m.gpus, "cpu": m.cpu, "cpu_count": m.cpu_count}]
    names = []
    for m in machines:
        name = f"{m['gpu_count']} x {m['gpu']}" if m.get("gpu_count") else f"{m['cpu']} CPU x {m['cpu_count']}, no GPU"
        if name not in names:
            names.append(name)
    return " / ".join(names)


def gpus_label(rows: list[dict]) -> str:
    """What one run used: `8 GPUs`, `8/32 GPUs` across contexts, `1 process (CPU)`."""
    counts = sorted({r["gpus"] for r in rows})
    on_cpu = all(r.get("device") == "cpu" for r in rows)
    unit = ("process" if counts == [1] else "processes") + " (CPU)" if on_cpu else ("GPU" if counts == [1] else "GPUs")
    return f"{'/'.join(map(str, counts))} {unit}"


def framework_names() -> dict[str, str]:
    """How to name the framework a published figure is attributed to (a scenario's
    `reference.framework`, a backend name): the installed backend's own display name."""
    return {name: backend.info.framework for name, backend in registry.backends().items()}


def method_of(row: dict) -> str:
    """full, lora or qlora: a full fine-tuning scenario is stored without `finetune`."""
    return (row["scenario_json"].get("finetune") or {}).get("method", "full")


def backend_colours(rows: list[dict]) -> dict:
    """A colour per backend of `rows`, the same on every chart drawn from them."""
    import matplotlib

    return {b: matplotlib.colormaps["tab10"](i % 10) for i, b in enumerate(sorted({r["backend"] for r in rows}))}


def context_axis(ax, contexts: list[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(contexts, [ctx_label(c) for c in contexts])
    ax.minorticks_off()
    ax.set_xlim(min(contexts) / 1.5, max(contexts) * 1.5)
    ax.set_xlabel("context length (tokens per packed row)")
    ax.grid(True, alpha=0.3)


def save(fig, out_dir: Path, stem: str) -> list[Path]:
    """`<stem>.png` and `<stem>.svg` in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext in ("png", "svg"):
        path = out_dir / f"{stem}.{ext}"
        fig.savefig(path, dpi=120, metadata=_SAVE_META[ext])
        paths.append(path)
    return paths
