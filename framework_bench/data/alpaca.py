"""Alpaca records (`instruction`, `input`, `output`) and the one prompt template every backend sees."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from framework_bench.scenario import DataSource

TEMPLATE_NAME = "alpaca-v1"
_PROMPT = (
    "Below is an instruction that describes a task{ctx}. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n{input}### Response:\n"
)


class DataError(RuntimeError):
    pass


def format_record(rec: dict) -> tuple[str, str]:
    """(prompt, response): the prompt gets no loss, the response does."""
    has_input = bool(rec.get("input"))
    prompt = _PROMPT.format(
        ctx=", paired with an input that provides further context" if has_input else "",
        instruction=rec["instruction"],
        input=f"### Input:\n{rec['input']}\n\n" if has_input else "",
    )
    return prompt, rec["output"]


def load_source(src: DataSource) -> tuple[list[dict], str]:
    """The records of one source and a fingerprint of its content (for the packing cache key)."""
    if src.path is not None:
        path = Path(src.path)
        try:
            raw = path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read Alpaca file {path}: {e.strerror}") from None
        text = raw.decode("utf-8")
        records = json.loads(text) if text.lstrip().startswith("[") else [json.loads(l) for l in text.splitlines() if l.strip()]
        fingerprint = hashlib.sha256(raw).hexdigest()
    else:
        try:
            import datasets  # only for hub ids: needs a network, and `pip install datasets`
        except ImportError:
            raise DataError(f"loading {src.hub!r} from the hub needs `pip install datasets` and a network") from None
        ds = datasets.load_dataset(src.hub, split=src.split)
        records = [dict(r) for r in ds]
        fingerprint = f"hub:{src.hub}:{src.split}:{ds._fingerprint}"
    for i, rec in enumerate(records):
        missing = {"instruction", "output"} - rec.keys()
        if missing:
            raise DataError(f"{src.path or src.hub}: record {i} lacks {', '.join(sorted(missing))}")
    return records, fingerprint
