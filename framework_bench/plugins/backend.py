"""The data that crosses between the host and a backend plugin (pydantic models).

Plugins receive and return these; workers never see them (they read `job.json`, see
`framework_bench/worker/files.py`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field

from framework_bench.worker.hparams import SEED
from framework_bench.spec.scenario import Scenario


OptimizerImpl = Literal["fused", "foreach", "for-loop"]
SettingsMode = Literal["matched", "native"]


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
        default_factory=lambda: {m: AdamWImpl(cuda="fused") for m in ("matched", "native")},
        description="the AdamW implementation per settings mode (recorded by the run as `optimizer_impl`)")
    sequence_parallel: Literal["deepspeed", "fsdp2"] = Field(
        "deepspeed", description="the engine its sequence parallel runs on: DeepSpeed bf16 or FSDP2 over fp32 weights")
    sequence_parallel_adamw: OptimizerImpl | None = Field(
        None, description="the AdamW of that engine when it builds its own (None: as `adamw`)")

    def optimizer_impl(self, scenario: Scenario, mode: SettingsMode = "matched") -> OptimizerImpl:
        if scenario.sequence_parallel > 1 and self.sequence_parallel_adamw:
            return self.sequence_parallel_adamw
        row = self.adamw[mode]
        return row.cuda if scenario.cluster.device == "cuda" else row.cpu


class Capabilities(BaseModel):
    """What a backend can run at all. The host enforces it before `fbench_check` is asked:
    a scenario outside it is `unsupported` with the reason `refusal` gives."""

    cpu: bool
    gpu: bool
    sequence_parallel: bool
    varlen: bool
    zero_stages: list[int] = Field(default_factory=lambda: [0])

    def refusal(self, scenario: Scenario, backend: str) -> str | None:
        """Why `backend`, declaring these capabilities, cannot run `scenario`; None if it may."""
        device = scenario.cluster.device
        if device == "cuda" and not self.gpu:
            return f"the {backend} backend declares no GPU support; the scenario runs on CUDA GPUs"
        if device == "cpu" and not self.cpu:
            return f"the {backend} backend declares no CPU support; the scenario runs on CPU"
        if scenario.sequence_parallel > 1 and not self.sequence_parallel:
            return f"the {backend} backend declares no sequence parallel; the scenario asks for {scenario.sequence_parallel}"
        if scenario.attention == "varlen" and not self.varlen:
            return f"the {backend} backend declares no varlen attention; the scenario asks for it"
        if scenario.zero_stage not in self.zero_stages:
            stages = "/".join(map(str, self.zero_stages))
            return f"the {backend} backend declares ZeRO stages {stages}; the scenario asks for {scenario.zero_stage}"
        return None


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


# The plugin contract this host implements. 1: the claims are optional (a claim not made is
# flagged "unverified"). 2: the step timer's clock lines (framework_bench/measure/clock.py) and every
# claim of `WorkerReport` are required; a run missing one is `invalid`. 3: the update projection
# after training too (framework_bench/worker/update.py). A plugin declares the version it was
# written against (`BackendInfo.contract`); one declaring none is of contract 1. A claim its
# contract does not name leaves its run `unverified` (framework_bench/measure/verify.py: CLAIMED_SINCE).
CONTRACT = 3


class BackendInfo(BaseModel):
    name: str
    framework: str
    description: str = ""
    capabilities: Capabilities
    env: EnvSpec
    memory: MemoryScheme = Field(default_factory=MemoryScheme, description=(
        "how it holds a training step: its AdamW table (per settings mode and device) and its "
        "sequence-parallel engine, the only backend-specific input of the memory estimate"))
    contract: int = Field(1, ge=1, le=CONTRACT, description=(
        "the plugin contract it was written against (`CONTRACT`): at the current one every claim is required, "
        "at an older one a claim not made leaves its runs `unverified`"))
    reference: bool = Field(False, description=(
        "the no-framework reference whose TGS the report shows the others' as a share of (one installed backend)"))
    manifest_packages: list[str] = Field(default_factory=list, description=(
        "distributions of its env whose versions each run's manifest records, beside the framework package "
        "and the common stack (`framework_bench/store/results.py`)"))
    report_notes: list[str] = Field(default_factory=list, description=(
        "what matched settings cannot align because it lives inside the framework's own code: listed in "
        "the report beside the recorded settings"))


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


class Job(BaseModel):
    """One run of one backend on one scenario; written to `run_dir/job.json` for the worker."""

    backend: str
    scenario: Scenario
    data_dir: Path
    data_sha256: str
    run_dir: Path
    device: Literal["cpu", "cuda"]
    nprocs: int = Field(1, description="processes per node the launcher starts")
    nnodes: int = 1
    settings_mode: Literal["matched", "native"] = Field(
        "matched", description="matched: both frameworks configured alike where both allow; native: as each "
                               "framework's own docs and examples configure it")
    seed: int = Field(SEED, ge=0, lt=2**32, description="one per compare: the initial weights "
                      "(framework_bench/worker/initial_weights.py) and the framework's own seeding")

    @computed_field
    @property
    def hf_config(self) -> dict:
        """The model's HF `config.json` (random weights are built from it; positions extended if asked)."""
        return self.scenario.model_config_for_run

    @property
    def job_file(self) -> Path:
        return self.run_dir / "job.json"

    def write(self) -> Path:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.job_file.write_text(self.model_dump_json(indent=2))
        return self.job_file


class LaunchPlan(BaseModel):
    """What to start: a module run with the backend env's Python, wrapped by the chosen launcher."""

    python: Path
    module: str = Field(description="worker module, run as `python -m MODULE ARGS...`")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict, description="added to the worker's environment")
    files: dict[str, Path] = Field(default_factory=dict, description="generated files, by role (shown by --dry-run)")


# Bounds of one step's figures: whatever a worker writes must fit a SQLite integer (< 2**63)
# and be a finite number; beyond these a line is a worker's bug, not a measurement.
MAX_STEP_TOKENS = 2**40
MAX_BYTES = 2**60
MAX_RANK = 2**20
MAX_STEP = 2**31 - 1


class StepMetric(BaseModel):
    """One line of a worker's common metrics file (`metrics/rank<R>.jsonl`)."""

    step: int = Field(ge=1, le=MAX_STEP)
    seconds: float = Field(gt=0, allow_inf_nan=False, description="wall time of the step, device-synchronised on GPU "
                           "(the interval: see the timing contract in framework_bench/plugins/hookspecs.py)")
    tokens: int = Field(ge=0, le=MAX_STEP_TOKENS,
                        description="tokens this rank's model received in this step (its SP shard only)")
    # NaN is a measurement (the training diverged), kept as NaN; infinity is no loss at all.
    loss: float | None = Field(None, description="mean training loss over the step's micro-batches, this rank")
    peak_mem_bytes: int | None = Field(None, ge=0, le=MAX_BYTES, description="peak allocated over the step (max RSS on CPU)")
    peak_reserved_bytes: int | None = Field(None, ge=0, le=MAX_BYTES,
                                            description="peak reserved by the allocator over the step (CUDA)")
    rank: int = Field(0, ge=0, le=MAX_RANK)


class WorkerReport(BaseModel):
    """What a backend read back from its run folder."""

    steps: list[StepMetric]
    data_sha256: str | None = Field(None, description="sha256 of the token ids the worker actually trained on")
    framework_version: str | None = None
    attention_used: str | None = None
    framework_throughput: dict[str, float] = Field(
        default_factory=dict, description="the framework's own figures (e.g. tokens_per_sec), mean over measured steps"
    )
    notes: list[str] = Field(
        default_factory=list, description="what the host should know about how the run went; kept in the result"
    )
    # Claims the host verifies (framework_bench/measure/verify.py); None when a plugin does not report them.
    settings: dict[str, str | int | float | bool | None] | None = Field(
        None, description="the settings in effect, read from the live objects (framework_bench/worker/settings.py)")
    param_count: int | None = Field(None, description="parameters of the model the framework built")
    consumed_rows: dict[int, dict[int, list[str]]] | None = Field(
        None, description="{rank: {step: row fingerprints}} fed to the trainer (framework_bench/worker/rows.py)")
    unclaimed: dict[str, str] = Field(default_factory=dict, description=(
        "claims (check names) the worker says it cannot make on this run, each with why: listed as unverified, "
        "the run `unverified` (shown, kept out of \"% of reference\" and the charts), never `invalid` for them"))
    startup_seconds: float | None = Field(None, description="worker start to the first step's start (imports, data, model build)")
    startup_breakdown: dict[str, float] | None = Field(
        None, description="startup_seconds by phase: imports, data, model_build, framework_setup (framework_bench.worker.StartupClock)")
