"""The plugin contract's data: what crosses between the host and a backend plugin, and
`CONTRACT`, the version of the contract this host implements (the hooks that carry these
are `framework_bench/plugins/hookspecs.py`).

Plugins receive and return these, validated by pydantic. What also crosses to the worker
(the job, the steps, the report) is defined once, in the worker SDK
(`framework_bench.worker.job`, `framework_bench.worker.report`), as stdlib dataclasses;
`Job`, `StepMetric` and `WorkerReport` here are those dataclasses validated by pydantic,
with pydantic's model API. The rest are pydantic models of the host's own.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from framework_bench import __version__
from framework_bench.scenario.scenario import Scenario
from framework_bench.worker import job as worker_job
from framework_bench.worker import report as worker_report
from framework_bench.worker.job import SETTINGS_MODES, SettingsMode


OptimizerImpl = Literal["fused", "foreach", "for-loop"]


class AdamWImpl(BaseModel):
    """The AdamW implementation a backend runs, per device (one row of the AdamW table)."""

    model_config = ConfigDict(frozen=True)

    cuda: OptimizerImpl
    cpu: OptimizerImpl = "for-loop"  # torch's own choice for CPU tensors with no flag set


class MemoryScheme(BaseModel):
    """What a backend declares about how it holds a training step (`BackendInfo.memory`):
    the only backend-specific input of the estimate."""

    model_config = ConfigDict(frozen=True)

    adamw: dict[SettingsMode, AdamWImpl] = Field(
        default_factory=lambda: {m: AdamWImpl(cuda="fused") for m in SETTINGS_MODES},
        description="the AdamW implementation per settings mode (recorded by the run as `optimizer_impl`)")
    sequence_parallel: Literal["deepspeed", "fsdp2"] = Field(
        "deepspeed", description="the engine its sequence parallel runs on: DeepSpeed bf16 or FSDP2 over fp32 weights")
    sequence_parallel_adamw: OptimizerImpl | None = Field(
        None, description="the AdamW of that engine when it builds its own (None: as `adamw`)")
    lm_head_tile: tuple[int, int] | None = Field(
        None, description="the (tokens, vocabulary entries) tile its loss projects the LM head in, never holding "
                          "the logits whole (None: the model's own head, full logits)")

    def optimizer_impl(self, scenario: Scenario, mode: SettingsMode = "matched") -> OptimizerImpl:
        if scenario.sequence_parallel > 1 and self.sequence_parallel_adamw:
            return self.sequence_parallel_adamw
        row = self.adamw[mode]
        return row.cuda if scenario.cluster.device == "cuda" else row.cpu


# A QLoRA scenario on CPU is refused for every backend, never run as LoRA instead: a bundled
# framework's bitsandbytes pin has no CPU 4-bit kernels (newer ones have), and one framework
# alone on CPU would compare nothing.
QLORA_ON_CPU = ("QLoRA runs on CUDA only: bitsandbytes 0.45.0 (a framework's pin) has no CPU 4-bit kernels, so not "
                "every framework could run it here")


class Capabilities(BaseModel):
    """What a backend can run at all. The host enforces it before `fbench_check` is asked:
    a scenario outside it is `unsupported` with the reason `refusal` gives."""

    cpu: bool
    gpu: bool
    sequence_parallel: bool
    varlen: bool
    zero_stages: list[int] = Field(default_factory=lambda: [0])
    # Off unless declared, so a plugin written before the finetune axis refuses adapters.
    lora: bool = False
    qlora: bool = False
    missing: dict[Literal["cpu", "gpu", "sequence_parallel", "varlen", "zero_stages", "lora", "qlora"], str] = Field(
        default_factory=dict, description="for a capability it does not declare, what it lacks there (its framework's "
                                          "engine not bound yet, a kernel): said in the refusal")

    def refusal(self, scenario: Scenario, backend: str) -> str | None:
        """Why `backend`, declaring these capabilities, cannot run `scenario`; None if it may."""
        device = scenario.cluster.device
        method = scenario.finetune.method
        if method == "qlora" and device == "cpu":
            return QLORA_ON_CPU
        if method != "full" and not getattr(self, method):
            shown = {"lora": "LoRA", "qlora": "QLoRA"}[method]
            return (f"the {backend} backend declares no {shown} support{self._lacks(method)}; "
                    f"the scenario asks for finetune method {method}")
        if device == "cuda" and not self.gpu:
            return f"the {backend} backend declares no GPU support{self._lacks('gpu')}; the scenario runs on CUDA GPUs"
        if device == "cpu" and not self.cpu:
            return f"the {backend} backend declares no CPU support{self._lacks('cpu')}; the scenario runs on CPU"
        if scenario.sequence_parallel > 1 and not self.sequence_parallel:
            return (f"the {backend} backend declares no sequence parallel{self._lacks('sequence_parallel')}; "
                    f"the scenario asks for {scenario.sequence_parallel}")
        if scenario.attention == "varlen" and not self.varlen:
            return f"the {backend} backend declares no varlen attention{self._lacks('varlen')}; the scenario asks for it"
        if scenario.zero_stage not in self.zero_stages:
            stages = "/".join(map(str, self.zero_stages))
            return (f"the {backend} backend declares ZeRO stages {stages}{self._lacks('zero_stages')}; "
                    f"the scenario asks for {scenario.zero_stage}")
        return None

    def _lacks(self, capability: str) -> str:
        return f" ({self.missing[capability]})" if capability in self.missing else ""


class EnvSpec(BaseModel):
    """How the host builds the backend's own virtual environment (see `framework_bench/envs/venvs.py`)."""

    requirements: dict[Literal["cpu", "cuda"], Path] = Field(
        description="requirements file per flavour; it pins torch (2.13.0 on CPU: the local CPU build)"
    )
    framework_package: str = Field(description="distribution whose version is reported as the framework version")
    post_install: list[str] = Field(
        default_factory=list,
        description="modules run as `python -m MODULE FLAVOUR` with the env's Python after pip (documented workarounds)",
    )
    supports: dict[str, str] = Field(default_factory=dict, description=(
        "the releases its binding was written for, per distribution, as pip specifiers (`{\"myframework\": \">=2.0,<3\"}`): "
        "a backend pinned outside them (`mybackend@1.9`) is `unsupported`, naming the range, before any env is made"))


class _HostContract(int):
    """The type of `CONTRACT` alone: the number, which `BackendInfo` can tell from a plugin's own."""


# The plugin contract this host implements. 1: the claims are optional (a claim not made is
# flagged "unverified"). 2: the step timer's clock lines (framework_bench/measure/clock.py) and every
# claim of `WorkerReport` are required; a run missing one is `invalid`. 3: the update projection
# after training too (framework_bench/worker/update.py). 4: the trained weights filled from the
# seed the host reveals once the worker is ready for its first step (`initial_reveal`:
# framework_bench/worker/initial_weights_worker.py, fill_revealed). 5: the live weights projected when
# the warm-up ends, onto a vector whose seed the host reveals then (`warmup_update`:
# framework_bench/worker/update.py, report_at_warmup_end). A plugin declares, as a number,
# the contract it was written against (`BackendInfo.contract`); one declaring none is of contract 1.
# A claim its contract does not name leaves its run `unverified` (framework_bench/measure/verify.py:
# CLAIMED_SINCE).
CONTRACT = _HostContract(5)
# A plugin declaring `contract=CONTRACT` (as CONTRIBUTING told it to up to 0.3.0) names whichever
# contract the host it runs on implements, not the one it was written against: the host's next
# release would require claims its worker never makes, and end every run `invalid`. It is read as
# the first contract the name stood for, so that the claims added since are `unverified` when not made.
CONTRACT_NAMED_FROM = 2

# The contracts this release runs (CONTRIBUTING.md, "Compatibility policy"): OLDEST_CONTRACT to
# CONTRACT. A release runs every contract the release before it ran, and the oldest goes only in
# the release named here a release ahead, OLDEST_DROPPED_IN (tests/test_contract.py fails once the
# version reaches it while the oldest is still run). A plugin declaring a contract outside them is
# refused before any run (`outside_window`, through the registry).
OLDEST_CONTRACT = 1
OLDEST_DROPPED_IN = "0.4.0"


def window() -> str:
    """The contracts this release runs, in words."""
    return f"plugin contracts {OLDEST_CONTRACT} to {CONTRACT}, contract {OLDEST_CONTRACT} until {OLDEST_DROPPED_IN}"


def outside_window(contract: int) -> str | None:
    """Why a plugin declaring `contract` cannot run on this release (one line), or None."""
    if contract > CONTRACT:
        return (f"it declares plugin contract {contract}, newer than fbench {__version__}, which runs {window()}: "
                "upgrade fbench")
    if contract < OLDEST_CONTRACT:
        return (f"it declares plugin contract {contract}; fbench {__version__} runs {window()}: "
                f"update it to contract {CONTRACT} (CONTRIBUTING.md, \"Compatibility and the contract version\")")
    return None


class BackendInfo(BaseModel):
    name: str
    framework: str
    description: str = ""
    capabilities: Capabilities
    env: EnvSpec
    memory: MemoryScheme = Field(default_factory=MemoryScheme, description=(
        "how it holds a training step: its AdamW table (per settings mode and device) and its "
        "sequence-parallel engine, the only backend-specific input of the memory estimate"))
    contract: int = Field(1, description=(
        "the plugin contract it was written against, as a number: every claim it names is required, a claim "
        "added by a later one and not made leaves its runs `unverified`; one outside `window()` is refused"))
    reference: bool = Field(False, description=(
        "the no-framework reference whose TGS the report shows the others' as a share of (one installed backend)"))
    manifest_packages: list[str] = Field(default_factory=list, description=(
        "distributions of its env whose versions each run's manifest records, beside the framework package "
        "and the common stack (`framework_bench/store/provenance.py`)"))
    report_notes: list[str] = Field(default_factory=list, description=(
        "what matched settings cannot align because it lives inside the framework's own code: listed in "
        "the report beside the recorded settings"))
    speed_settings: list[str] = Field(default_factory=list, description=(
        "settings keys that only this backend's engine records (DeepSpeed's ZeRO buckets, say) and that change "
        "a step's time: marked where backends differ, beside the keys every backend records"))

    @field_validator("contract", mode="before")
    @classmethod
    def _written_against(cls, value: Any) -> Any:
        return CONTRACT_NAMED_FROM if type(value) is _HostContract else value  # `contract=CONTRACT`


class Machine(BaseModel):
    """What the host can see of this machine without importing torch."""

    gpus: int = 0
    gpu_name: str | None = None
    gpu_memory_gib: float | None = None
    cpu: str = ""
    cpu_count: int = 1

    @property
    def device(self) -> Literal["cpu", "cuda"]:
        return "cuda" if self.gpus else "cpu"


class BackendEnv(BaseModel):
    """A backend's virtual environment as found on disk."""

    name: str
    path: Path
    python: Path
    flavour: Literal["cpu", "cuda"] | None = None
    ready: bool = False
    problem: str | None = None
    versions: dict[str, str] = Field(default_factory=dict)

    def has(self, distribution: str) -> bool:
        """Whether a distribution is installed (names compared as pip normalises them)."""
        key = distribution.lower().replace("_", "-")
        return any(k.lower().replace("_", "-") == key for k in self.versions)

    def version(self, distribution: str) -> str | None:
        key = distribution.lower().replace("_", "-")
        return next((v for k, v in self.versions.items() if k.lower().replace("_", "-") == key), None)


def _init_fields(obj: Any) -> dict:
    """A dataclass instance's constructor arguments, nested dataclasses as dicts (so each is
    validated again) and everything else as it is (a validated `Scenario` stays one)."""
    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init}
        if isinstance(value, list):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value
    return plain(obj)


@functools.cache
def _adapter(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


class _Validated:
    """pydantic's model API on a worker SDK dataclass validated by the host: the names callers
    (and plugins written when these were pydantic models) use."""

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """`obj` (a dict, or an instance of this dataclass or of the worker SDK's, built without
        validation) validated as this type."""
        return _adapter(cls).validate_python(_init_fields(obj))

    @classmethod
    def model_validate_json(cls, text: str | bytes) -> Self:
        return _adapter(cls).validate_json(text)

    def model_copy(self, update: dict | None = None) -> Self:
        return dataclasses.replace(self, **(update or {}))


@pydantic_dataclass(kw_only=True)
class Job(_Validated, worker_job.Job):
    """One run of one backend on one scenario; written to `run_dir/job.json` for the worker.

    The worker SDK's `Job` (framework_bench/worker/job.py defines every field), validated,
    with the whole validated `Scenario` where a worker reads its view of it."""

    scenario: Scenario

    def __post_init__(self) -> None:
        super().__post_init__()
        # The model's HF `config.json` (random weights are built from it; positions extended if asked).
        self.hf_config = self.scenario.model_config_for_run

    @property
    def job_file(self) -> Path:
        return self.run_dir / "job.json"

    def write(self) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        # `raw` and `verified_sha256` belong to the process that reads the file, never to the file.
        self.job_file.write_bytes(_adapter(Job).dump_json(self, indent=2, exclude={"raw", "verified_sha256"}))
        return self.job_file


class LaunchPlan(BaseModel):
    """What to start: a module run with the backend env's Python, wrapped by the chosen launcher."""

    python: Path
    module: str = Field(description="worker module, run as `python -m MODULE ARGS...`")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="added to the worker's environment")
    files: dict[str, Path] = Field(default_factory=dict, description="generated files, by role (shown by --dry-run)")


@pydantic_dataclass(kw_only=True)
class StepMetric(_Validated, worker_report.StepMetric):
    """One line of a worker's common metrics file: the worker SDK's `StepMetric`, validated."""


@pydantic_dataclass(kw_only=True)
class WorkerReport(_Validated, worker_report.WorkerReport):
    """What a backend read back from its run folder: the worker SDK's `WorkerReport`, validated
    (its steps are the SDK's `StepMetric`s)."""
