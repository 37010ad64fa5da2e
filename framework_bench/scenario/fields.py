"""The field types every part of a scenario shares: strict, bounded counts; lengths in tokens
with `8k`/`1M` shorthands; and the base model that refuses unknown keys, so a typo never
passes silently."""

from __future__ import annotations

import re
from typing import Annotated

from annotated_types import Le
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict

_SUFFIX = {"": 1, "k": 1024, "m": 1024 * 1024}


def parse_length(value: object) -> object:
    """Accept `8k`, `128k`, `1M` (binary multiples, as the published configs use) or an integer."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([kKmM]?)\s*", value)
        if not m:
            raise ValueError(f"{value!r} is not a length: use an integer or a shorthand like 8k, 128k, 1M")
        return int(m.group(1)) * _SUFFIX[m.group(2).lower()]
    return value


# Strict: no booleans, floats or numeric strings where a count belongs.
# Bounded so that every count fits a run folder's name, a SQLite integer and a SLURM time limit.
MAX_COUNT = 2**31 - 1
MAX_CONTEXT = 2**30  # a billion tokens a row: far beyond any published long-context run
Int = Annotated[int, Strict(), Le(MAX_COUNT)]
Length = Annotated[int, BeforeValidator(parse_length), Strict(), Field(gt=0), Le(MAX_CONTEXT)]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
