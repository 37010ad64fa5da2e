"""The job a worker runs: `load_job(path)` reads the host's `job.json` into a typed `Job`.

The `Job` dataclass is the one definition of the job file: the host's
`framework_bench.plugins.contract.Job` is this `Job` validated with pydantic, holding the whole
validated scenario. A worker reads the file with the stdlib only (worker envs are the
frameworks', without pydantic). Reading is tolerant both ways: a key this SDK does not know (a
newer host) is kept in `raw` and ignored, a key it expects but the file lacks (an older host)
takes the host's default.

The scenario's fields are defined and validated once, by the host's pydantic models
(framework_bench/scenario/scenario.py); a worker reads them as the attributes of the dict the host
dumped. What follows from them (micro-batches per step, data-parallel size, rows needed, tokens
per GPU) is worked out here only, in `Scenario`, `Steps` and `FineTune`, which the host's models
and the worker's view of the file both derive from.

The packed rows are opened through the job (`open_rows`), which checks that they hash to
the stream the host named; `check_data` does the same for rows a worker converted to its
framework's format. The sha256 so verified is the one the report writer records
(`framework_bench.worker.report`): a worker never compares or reports it by hand.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal, get_args

from framework_bench.worker.hparams import SEED
from framework_bench.worker.loss_schemes import LossScheme

if TYPE_CHECKING:
    import numpy as np

    from framework_bench.worker.packed import PackedRows


# matched: both frameworks configured alike where both allow; native: as each framework's own
# docs and examples configure it.
SettingsMode = Literal["matched", "native"]
SETTINGS_MODES: tuple[SettingsMode, ...] = get_args(SettingsMode)


def _known(cls, data: dict, **overrides) -> Any:
    """`cls` from the keys of `data` it declares (the others are a newer host's), then `overrides`."""
    names = {f.name for f in fields(cls) if f.init}
    return cls(**{k: v for k, v in data.items() if k in names}, **overrides)


class Steps:
    """What follows from a scenario's `steps` (`warmup`, `measured`, `unit`)."""

    @property
    def total(self) -> int:
        return self.warmup + self.measured


class FineTune:
    """What follows from a scenario's `finetune`: `full`, or LoRA adapters of `rank` on the
    decoder layers' `targets` over a frozen base of `base_dtype`; `qlora` stores that base in 4
    bits (`quant_type`, `double_quant`, dequantized to `compute_dtype`).
    `framework_bench.worker.adapters` turns it into peft's config."""

    @property
    def adapters(self) -> bool:
        return self.method != "full"


class Scenario:
    """What follows from a scenario's fields: the quantities every backend derives alike."""

    @property
    def micro_per_step(self) -> int:
        """Micro-iterations in one step of `steps.unit`."""
        return 1 if self.steps.unit == "micro" else self.grad_accum

    @property
    def gpus(self) -> int:
        """Processes over all nodes (`cluster.gpus`)."""
        return self.cluster.gpus

    @property
    def data_parallel(self) -> int:
        return self.gpus // self.sequence_parallel

    @property
    def tokens_per_gpu_micro_batch(self) -> int:
        """Tokens one GPU holds activations for in one micro-batch (its sequence-parallel shard)."""
        return self.micro_batch * self.context_length // self.sequence_parallel

    @property
    def tokens_per_gpu_step(self) -> int:
        """Tokens one GPU trains in one step of `steps.unit`."""
        return self.tokens_per_gpu_micro_batch * self.micro_per_step

    @property
    def rows_needed(self) -> int:
        """Packed rows the warm-up and measured steps consume across the data-parallel group."""
        return self.steps.total * self.micro_batch * self.micro_per_step * self.data_parallel


class _Fields:
    """A JSON object's members as attributes (nested objects too), the object itself as `raw`."""

    def __init__(self, data: dict) -> None:
        self.raw = data
        # Through __dict__: a member named like a derived property (a newer host's) never hides it.
        vars(self).update({k: _Fields(v) if isinstance(v, dict) else v for k, v in data.items()})


class _StepsFields(_Fields, Steps):
    pass


class _FineTuneFields(_Fields, FineTune):
    pass


class _ScenarioFields(_Fields, Scenario):
    def __init__(self, data: dict) -> None:
        super().__init__(data)
        self.steps = _StepsFields(data["steps"])
        # The host leaves a full fine-tuning scenario's `finetune` out of its dump (scenario/scenario.py).
        self.finetune = _FineTuneFields(data.get("finetune") or {"method": "full"})


MAX_SEED = 2**32  # numpy's and torch's seeding both take a 32-bit unsigned seed


@dataclass(kw_only=True)
class Job:
    """One run of one backend on one scenario, as `job.json` holds it.

    `job["key"]` and `job.get("key")` read the file's own dict, for workers written against
    the plain-dict job (`framework_bench.worker_io.load_job` before the typed one)."""

    backend: str
    scenario: Scenario
    data_dir: Path
    data_sha256: str
    run_dir: Path
    device: Literal["cpu", "cuda"] = "cpu"
    nprocs: int = 1  # processes per node the launcher starts
    nnodes: int = 1
    settings_mode: SettingsMode = "matched"
    # One per compare: the initial weights (framework_bench/worker/initial_weights_host.py) and the
    # framework's own seeding.
    seed: int = SEED
    hf_config: dict = field(default_factory=dict, repr=False)  # the model's HF config.json, positions extended if asked
    # How a worker that can normalise the loss several ways must (`loss_schemes.SCHEMES`): the
    # host sets it on a reference run for a framework that normalises otherwise
    # (`framework_bench.measure.losses.needed_reference_loss`). None: the worker's own way.
    # A worker that cannot choose ignores it; a job file without it (an older host) reads None.
    loss_scheme: LossScheme | None = None
    # Each row's labels rolled by one instead of shifted, so that its last position predicts the
    # row's first label: the target ms-swift's sequence parallel trains, set by the host on a
    # reference run judging such a run (`measure.losses.needed_reference_loss`). Sequence parallel only.
    labels_rolled: bool = False
    raw: dict = field(default_factory=dict, repr=False)
    # The sha256 of the rows this process checked against `data_sha256` (open_rows / check_data).
    verified_sha256: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        # Raised as a validation error where the host builds the job (pydantic runs this).
        if not 0 <= self.seed < MAX_SEED:
            raise ValueError(f"seed {self.seed} is not in [0, 2**32)")

    @classmethod
    def from_dict(cls, data: dict) -> Job:
        return _known(cls, {k: v for k, v in data.items() if k not in ("run_dir", "data_dir", "scenario")},
                      run_dir=Path(data["run_dir"]), data_dir=Path(data["data_dir"]),
                      scenario=_ScenarioFields(data["scenario"]), raw=data)

    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.raw.get(key, default)

    @property
    def steps(self) -> int:
        """Warm-up and measured steps: the steps the worker runs."""
        return self.scenario.steps.total

    @property
    def micro_batches_per_step(self) -> int:
        return self.scenario.micro_per_step

    @property
    def data_parallel(self) -> int:
        return self.scenario.data_parallel

    @property
    def rows_needed(self) -> int:
        return self.scenario.rows_needed

    def check_data(self, sha256: str, what: str) -> None:
        """Refuse to train on rows that are not the host's stream: `sha256` is what `what`
        hashes to (`framework_bench.worker.packed.stream_sha256`)."""
        if sha256 != self.data_sha256:
            raise SystemExit(f"{what} has sha256 {sha256}, the host expected {self.data_sha256}")
        self.verified_sha256 = sha256

    def open_rows(self) -> PackedRows:
        """The host's packed rows (memory-mapped), after checking they hash to its stream."""
        # Imported here: the host reads this module for the job's schema and the scenario's
        # derived quantities (scenario/scenario.py) and never opens rows, so it does not load numpy for it.
        from framework_bench.worker.packed import PackedRows
        rows = PackedRows(self.data_dir)
        self.check_data(rows.sha256(), f"packed data in {self.data_dir}")
        return rows

    def batches(self, rows: PackedRows, rank: int, world: int) -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        """Per optimizer step, its `grad_accum` micro-batches as (input_ids, labels) int64 arrays,
        the rows read in order: data-parallel rank r takes micro-batch g's rows
        [(g * world + r) * micro_batch, ... + micro_batch)."""
        import numpy as np  # as in open_rows: a worker's import only
        s = self.scenario
        mb, ga = s.micro_batch, s.grad_accum
        needed = self.steps * ga * world * mb
        if needed > rows.rows:
            raise SystemExit(f"the run needs {needed} rows, the packed stream has {rows.rows}")
        for step in range(self.steps):
            yield [tuple(np.asarray(a[lo:lo + mb], dtype=np.int64) for a in (rows.input_ids, rows.labels))
                   for lo in (((step * ga + micro) * world + rank) * mb for micro in range(ga))]


def load_job(path: str | Path) -> Job:
    """The job the host wrote (`framework_bench.plugins.contract.Job`, as JSON)."""
    return Job.from_dict(json.loads(Path(path).read_text()))
