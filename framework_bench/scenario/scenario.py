"""Scenarios: one validated description of a training run, shared by every backend.

Every field is defined and validated here (the fine-tuning axis in `scenario/finetune.py`, the
shared field types in `scenario/fields.py`); YAML files in `scenarios/` are parsed into `Scenario`.
Unknown keys are errors, so a typo never passes silently. What follows from the fields
(micro-batches per step, data-parallel size, rows needed, tokens per GPU) is worked out by the
worker SDK's `framework_bench.worker.job.Scenario`, which `Scenario` derives from, so host and
worker compute it alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (BeforeValidator, Field, PrivateAttr, SerializerFunctionWrapHandler, Strict, StrictBool,
                      ValidationError, ValidationInfo, field_validator, model_serializer, model_validator)

from framework_bench.scenario import places, strict_yaml
from framework_bench.scenario.catalog import DATASETS, DEFAULT_DATASET, DataSource
from framework_bench.scenario.families import ConfigFileError, read_config_json
from framework_bench.scenario.fields import Int, Length, StrictModel
from framework_bench.scenario.finetune import FineTune
from framework_bench.scenario.models import PRESETS, ModelArch
from framework_bench.worker import job

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SCENARIO_DIR = places.BUNDLED_SCENARIOS
MAX_NAME = 64  # run folders are named <time>-<scenario>-<backend>-<n>: within a file name's 255 bytes


def _whole(value: object) -> object:
    """YAML's `true` or `2.0` where an integer belongs is a mistake, never 1 or 2."""
    if isinstance(value, (bool, float)):
        raise ValueError(f"{value!r} is not an integer")
    return value


class ModelSpec(StrictModel):
    """A preset by name or a model's HF `config.json` (`config_file`: no weights, random ones are
    built), optionally with some fields overridden, or a full inline architecture. A config file is
    read once, when the scenario is: its dump holds the fields read, inline (`config`), so a stored
    run or a worker's job never reads the file again."""

    preset: str | None = None
    config_file: str | None = Field(None, description="a model's config.json, or the folder holding it (relative: "
                                                      "to the scenario file's folder)")
    config: dict = Field(default_factory=dict, description="HF-style fields (override the preset or file, or all of them)")
    _read: dict = PrivateAttr(default_factory=dict)  # the config file's fields

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; known: {', '.join(sorted(PRESETS))}")
        return v

    def arch(self) -> ModelArch:
        base = PRESETS[self.preset].model_dump() if self.preset else self._read
        return ModelArch.model_validate({**base, **self.config})

    @model_validator(mode="after")
    def _buildable(self, info: ValidationInfo) -> "ModelSpec":
        """The architecture's errors under their place in the file (`model.config.FIELD`)."""
        if self.config_file is not None:
            if self.preset is not None:
                raise ValueError("give a preset or a config_file, not both")
            path = Path(self.config_file).expanduser()
            folder = (info.context or {}).get("scenario_folder")
            try:
                self._read = read_config_json(path if path.is_absolute() or folder is None else folder / path)
            except ConfigFileError as e:
                raise ValueError(f"config_file: {e}") from None
        try:
            arch = self.arch()
        except ValidationError as e:
            raise ValueError("; ".join(".".join(["config", *map(str, x["loc"])]) + ": " + x["msg"].removeprefix("Value error, ")
                                       for x in e.errors())) from None
        if not math.isfinite(arch.rope_theta):
            raise ValueError(f"config.rope_theta: {arch.rope_theta} is not a finite number")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict:
        """A config file's fields inline, the file itself left out; without one, as before it existed."""
        data = handler(self)
        if data.pop("config_file", None) is not None:
            data["config"] = {**self._read, **self.config}
        return data


class Cluster(StrictModel):
    nodes: Int = Field(1, gt=0)
    gpus_per_node: Int = Field(1, gt=0, description="processes per node; on CPU, worker processes")
    gpus: Int | None = Field(None, gt=0, description="total; optional, must equal nodes x gpus_per_node")
    device: Literal["cpu", "cuda"] = "cuda"

    @model_validator(mode="after")
    def _total(self) -> "Cluster":
        if self.gpus is None:
            self.gpus = self.nodes * self.gpus_per_node
        elif self.gpus != self.nodes * self.gpus_per_node:
            raise ValueError(
                f"gpus {self.gpus} != nodes {self.nodes} x gpus_per_node {self.gpus_per_node}"
            )
        return self


class Steps(StrictModel, job.Steps):
    warmup: Int = Field(2, ge=0)
    measured: Int = Field(5, gt=0)
    unit: Literal["optimizer", "micro"] = Field(
        "optimizer",
        description="what a step is: an optimizer step (grad_accum micro-iterations and the update), or one "
        "micro-iteration (forward + backward of one micro batch; the update only in every grad_accum-th), "
        "for rows whose optimizer steps take hours (grad_accum = SP at 1M tokens)",
    )


class TokenizerSpec(StrictModel):
    """`builtin-bytes`: the project's offline byte-level tokenizer; else a local path or hub id."""

    kind: Literal["builtin-bytes", "path", "hub"] = "builtin-bytes"
    name: str | None = Field(None, description="local path (kind=path) or hub repo id (kind=hub)")

    @model_validator(mode="after")
    def _named(self) -> "TokenizerSpec":
        if self.kind != "builtin-bytes" and not self.name:
            raise ValueError(f"tokenizer kind {self.kind!r} needs a name")
        return self


class Dataset(StrictModel):
    """A named dataset fbench knows how to fetch, or your own sources (files or hub ids)."""

    name: str | None = Field(None, description=f"one of {', '.join(DATASETS)} (default {DEFAULT_DATASET}); "
                                                "fetched into FBENCH_DATA or fbench's cache")
    sources: list[DataSource] | None = Field(None, min_length=1, description="your own Alpaca files or hub ids")
    repeat: Int = Field(1, gt=0, description="at least this many copies; raised when the steps need more tokens")
    tokenizer: TokenizerSpec = Field(default_factory=TokenizerSpec)

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in DATASETS:
            raise ValueError(f"unknown dataset {v!r}; known: {', '.join(DATASETS)}")
        return v

    @model_validator(mode="after")
    def _one(self) -> "Dataset":
        if self.name is not None and self.sources is not None:
            raise ValueError("give a dataset name or sources, not both")
        if self.sources is None:
            self.name = self.name or DEFAULT_DATASET
        return self


# A published figure is divided by (step time, SLURM time limit, "% of"): bounded so that no
# quotient overflows (5e-324 is positive and finite, and its inverse is not).
MIN_FIGURE, MAX_FIGURE = 1e-3, 1e9


class Reference(StrictModel):
    """A published figure for this scenario, to draw and compare against."""

    tgs: Annotated[float, Strict()] = Field(ge=MIN_FIGURE, le=MAX_FIGURE, allow_inf_nan=False)
    tflops: Annotated[float, Strict()] = Field(ge=MIN_FIGURE, le=MAX_FIGURE, allow_inf_nan=False)
    hardware: str
    framework: str = Field(description="whose figure it is: a backend name (the report names it by its display name)")
    source: str = ""


class Scenario(StrictModel, job.Scenario):
    """One training run, as every backend runs it; what follows from its fields (`micro_per_step`,
    `data_parallel`, `tokens_per_gpu_step`, `rows_needed`) is the worker SDK's `job.Scenario`."""

    name: str = Field(pattern=r"^[a-z0-9_]+$", max_length=MAX_NAME)
    description: str = ""
    model: ModelSpec
    cluster: Cluster = Field(default_factory=Cluster)
    context_length: Length = Field(description="packed row length, in tokens")
    sequence_parallel: Int = Field(1, gt=0)
    micro_batch: Int = Field(1, gt=0)
    grad_accum: Int = Field(1, gt=0)
    zero_stage: Annotated[Literal[0, 1, 2, 3], BeforeValidator(_whole)] = 0
    activation_checkpointing: StrictBool = True
    precision: Literal["bf16", "fp32"] = "bf16"
    attention: Literal["packed", "varlen"] = Field(
        "packed", description="packed: attention may cross example boundaries (as published); varlen: per example"
    )
    extend_positions: StrictBool = Field(False, description="allow context_length > max_position_embeddings")
    steps: Steps = Field(default_factory=Steps)
    dataset: Dataset = Field(default_factory=Dataset)
    reference: Reference | None = None
    finetune: FineTune = Field(default_factory=FineTune, description="full fine-tuning, or LoRA/QLoRA adapters")
    # Set by `load_file` when the file is one of the user's taking a bundled scenario's name.
    _shadows: str | None = PrivateAttr(None)

    @property
    def shadow_note(self) -> str | None:
        """The note a run of this scenario carries when the user's file replaced the bundled one."""
        return self._shadows

    @model_validator(mode="after")
    def _consistent(self) -> "Scenario":
        arch = self.arch
        sp, gpus = self.sequence_parallel, self.cluster.gpus
        if gpus % sp:
            raise ValueError(f"sequence_parallel {sp} does not divide the GPU count {gpus}")
        if self.context_length % sp:
            raise ValueError(f"context_length {self.context_length} is not divisible by sequence_parallel {sp}")
        if arch.num_attention_heads % sp:
            raise ValueError(
                f"sequence_parallel {sp} does not divide num_attention_heads {arch.num_attention_heads}"
            )
        if self.context_length > arch.max_position_embeddings and not self.extend_positions:
            raise ValueError(
                f"context_length {self.context_length} exceeds max_position_embeddings "
                f"{arch.max_position_embeddings}; set extend_positions: true to allow it"
            )
        self.finetune.resolved(arch, self.precision)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict:
        """Full fine-tuning is left out of a dump, so a full scenario's dump (a stored row's
        `scenario_json`, its definition in `run/compare.py`, job.json) is what it was before
        the axis existed, and a dump without `finetune` reads back as full."""
        data = handler(self)
        if self.finetune.method == "full":
            data.pop("finetune", None)
        return data

    @property
    def arch(self) -> ModelArch:
        return self.model.arch()

    @property
    def model_config_for_run(self) -> dict:
        """The HF config a worker builds, with positions extended when the scenario asks."""
        cfg = self.arch.hf_config()
        cfg["max_position_embeddings"] = max(cfg["max_position_embeddings"], self.context_length)
        return cfg


class ScenarioError(Exception):
    """A scenario file that cannot be used; the message names each bad field."""


def format_validation_error(err: ValidationError, source: str) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(scenario)"
        msg = e["msg"].removeprefix("Value error, ")
        lines.append(f"{source}: {where}: {msg}")
    return "\n".join(lines)


def load_file(path: Path) -> Scenario:
    try:
        raw = strict_yaml.load(path)
    except strict_yaml.Unreadable as e:
        raise ScenarioError(str(e)) from None
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario file must hold a mapping")
    raw.setdefault("name", path.stem)
    if raw["name"] != path.stem:
        raise ScenarioError(f"{path}: name: {raw['name']!r} differs from the file name {path.stem!r}")
    try:
        scenario = Scenario.model_validate(raw, context={"scenario_folder": path.parent})
    except ValidationError as e:
        raise ScenarioError(format_validation_error(e, str(path))) from None
    if bundled := shadowing(path):
        scenario._shadows = f"scenario {scenario.name}: the user's {path}, over the bundled {bundled}"
    return _resolve_paths(scenario, PROJECT_ROOT)


def _resolve_paths(scenario: Scenario, base: Path) -> Scenario:
    """Relative data/tokenizer paths are relative to the project root, so any cwd works."""
    for src in scenario.dataset.sources or []:
        if src.path is not None and not Path(src.path).is_absolute():
            src.path = str((base / src.path).resolve())
    tok = scenario.dataset.tokenizer
    if tok.kind == "path" and not Path(tok.name).is_absolute():
        tok.name = str((base / tok.name).resolve())
    return scenario


def scenario_paths(directory: Path = SCENARIO_DIR) -> list[Path]:
    """Every scenario file by name: the user's own (`places.user_scenarios()`) over `directory`'s."""
    by_name = {p.stem: p for folder in (directory, places.user_scenarios()) for p in sorted(folder.glob("*.yaml"))}
    return sorted(by_name.values(), key=lambda p: p.stem)


def _resolved(p: Path) -> Path:
    try:
        return p.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop, before Python 3.13
        raise ScenarioError(f"{p}: cannot read: {getattr(e, 'strerror', None) or e}") from None


def shadowing(path: Path, directory: Path = SCENARIO_DIR) -> Path | None:
    """The bundled scenario file that `path`, one of the user's scenarios, takes the name of."""
    bundled = directory / path.name
    mine = path.parent.resolve() == places.user_scenarios().resolve()
    return bundled if mine and bundled.is_file() else None


def _exists(p: Path) -> bool:
    """Whether `p` exists; a name no file can have (over 255 bytes) names none, not an OSError."""
    try:
        return p.exists()
    except OSError:
        return False


def source_path(name_or_path: str, directory: Path = SCENARIO_DIR) -> Path:
    """The file `load(name_or_path)` reads, resolved. An empty name is refused: as a path it is the
    folder the command was typed in."""
    if not name_or_path.strip():
        raise ScenarioError(f"an empty scenario name ({name_or_path!r}): give a scenario name, glob or file "
                            "(see `fbench scenarios`)")
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or _exists(p):
        return _resolved(p)
    candidate = next((c for c in (places.user_scenarios() / f"{name_or_path}.yaml", directory / f"{name_or_path}.yaml")
                      if _exists(c)), None)
    if candidate is None:
        known = ", ".join(p.stem for p in scenario_paths(directory))
        raise ScenarioError(f"no scenario named {name_or_path!r}; known: {known}")
    return candidate.resolve()


def load(name_or_path: str, directory: Path = SCENARIO_DIR) -> Scenario:
    """A scenario by name (the bundled ones and the user's: `scenario_paths`) or by file path."""
    return load_file(source_path(name_or_path, directory))


def load_all(directory: Path = SCENARIO_DIR) -> list[Scenario]:
    """Every scenario; one of the user's that does not validate is left out (`fbench scenarios`
    shows it invalid, with why), so one bad file of theirs cannot stop the charts and report of
    unrelated runs. A bundled one that does not validate is fbench's bug, and raises."""
    found = []
    for p in scenario_paths(directory):
        try:
            found.append(load_file(p))
        except ScenarioError:
            if p.parent == directory:
                raise
    return found
