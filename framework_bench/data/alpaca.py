"""Alpaca records (`instruction`, `input`, `output`) and the one prompt template every backend sees."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from framework_bench.scenario.scenario import DataSource
from framework_bench.scenario.catalog import DataError

TEMPLATE_NAME = "alpaca-v1"
# The full Alpaca sets are 20-50 MiB; one file is read and parsed whole (a 1 GiB one ran out of memory).
MAX_FILE_BYTES = 256 << 20
_PROMPT = (
    "Below is an instruction that describes a task{ctx}. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n{input}### Response:\n"
)


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
    where = src.path or src.hub
    if src.path is not None:
        path = Path(src.path)
        if path.exists() and not path.is_file():  # /dev/zero, a FIFO: would be read for ever
            raise DataError(f"cannot read Alpaca file {path}: not a regular file")
        try:
            if (size := path.stat().st_size) > MAX_FILE_BYTES:  # parsed whole, at many times its size
                raise DataError(f"cannot read Alpaca file {path}: {size / 2**20:,.0f} MiB is larger than the "
                                f"{MAX_FILE_BYTES >> 20} MiB one file may hold; split it into several sources")
            raw = path.read_bytes()
        except OSError as e:
            raise DataError(f"cannot read Alpaca file {path}: {e.strerror}") from None
        try:
            text = raw.decode("utf-8")
            records = (json.loads(text) if text.lstrip().startswith("[")
                       else [json.loads(line) for line in text.splitlines() if line.strip()])
        except ValueError as e:  # not UTF-8, or not JSON (a truncated file, random bytes)
            raise DataError(f"{path} is not an Alpaca JSON file (a list of records, or one record per line): "
                            f"{e}") from None
        except RecursionError:  # valid JSON nested thousands deep: no Alpaca record is
            raise DataError(f"{path} is not an Alpaca JSON file: nested too deeply") from None
        fingerprint = hashlib.sha256(raw).hexdigest()
    else:
        try:
            import datasets  # only for hub ids: needs a network, and `pip install datasets`
        except ImportError:
            raise DataError(f"loading {src.hub!r} from the hub needs `pip install datasets` and a network") from None
        try:
            ds = datasets.load_dataset(src.hub, split=src.split)
        except Exception as e:  # offline, unknown id, no access: the hub's reasons are many
            raise DataError(f"cannot load {src.hub!r} from the hub: {str(e).splitlines()[0] if str(e) else e!r}") from None
        records = [dict(r) for r in ds]
        fingerprint = f"hub:{src.hub}:{src.split}:{ds._fingerprint}"
    if src.columns and isinstance(records, list):
        records = [{**rec, **{f: rec.get(c) for f, c in src.columns.items()}} if isinstance(rec, dict) else rec
                   for rec in records]
        fingerprint += f":columns={json.dumps(src.columns, sort_keys=True)}"
    check_records(records, where)
    return records, fingerprint


_FIELDS = ("instruction", "input", "output")


def check_records(records: object, where: str) -> None:
    """Alpaca records: a non-empty list of mappings with text `instruction` and `output` (and
    text or null `input`); anything else would pack garbage or crash the tokenizer."""
    if not isinstance(records, list) or not records:
        raise DataError(f"{where}: expected a non-empty list of Alpaca records")
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            raise DataError(f"{where}: record {i} is {type(rec).__name__}, not a mapping with instruction/output")
        missing = {"instruction", "output"} - rec.keys()
        if missing:
            raise DataError(f"{where}: record {i} lacks {', '.join(sorted(missing))}")
        for key in _FIELDS:
            value = rec.get(key)
            if not isinstance(value, str) and not (key == "input" and value is None):
                raise DataError(f"{where}: record {i}: {key} is {type(value).__name__}, not text")
            if isinstance(value, str) and not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate ("\ud800") is valid JSON but no text
                    raise DataError(f"{where}: record {i}: {key} holds {value[e.start]!r}, half of a character "
                                    "(a lone UTF-16 surrogate), not text") from None
