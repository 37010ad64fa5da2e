"""The fine-tuning axis of a scenario: which weights train (full, LoRA or QLoRA) and every
adapter setting, validated, then resolved against the model and the precision."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, Strict, StrictBool, model_validator

from framework_bench.scenario.fields import Int, StrictModel
from framework_bench.scenario.models import ModelArch
from framework_bench.worker import job

ALL_LINEAR = "all-linear"
Dtype = Literal["bf16", "fp16", "fp32"]
FourBit = Literal["nf4", "fp4"]
_ADAPTER_FIELDS = ("rank", "alpha", "dropout", "targets", "base_dtype")
_QUANT_FIELDS = ("quant_type", "double_quant", "compute_dtype")


class FineTune(StrictModel, job.FineTune):
    """Which weights train: all of them (`full`), or low-rank adapters on a frozen base (`lora`),
    the base stored in 4 bits (`qlora`, bitsandbytes). Every adapter setting is named in the
    file or resolved here (the scenario fills in what follows from it), so a run never trains
    with a framework's unnamed default."""

    method: Literal["full", "lora", "qlora"] = "full"
    rank: Int | None = Field(None, ge=1, description="r: the adapters' inner dimension")
    alpha: Annotated[float, Strict()] | None = Field(None, gt=0, allow_inf_nan=False,
                                                     description="the adapters' output is scaled by alpha / rank")
    dropout: Annotated[float, Strict()] | None = Field(None, ge=0, lt=1, description="on the adapters' input (default 0)")
    targets: list[str] | Literal["all-linear"] | None = Field(
        None, min_length=1, description=f"the decoder layers' linear modules to adapt, or {ALL_LINEAR!r} (every one; "
                                        "the LM head never)")
    base_dtype: Dtype | FourBit | None = Field(
        None, description="the frozen base weights: bf16/fp16/fp32 for lora (default: the scenario's precision), "
                          "the 4-bit quant_type for qlora")
    quant_type: FourBit | None = Field(None, description="qlora: bitsandbytes' 4-bit data type (default nf4)")
    double_quant: StrictBool | None = Field(None, description="qlora: quantize the block scales too (default true)")
    compute_dtype: Dtype | None = Field(None, description="qlora: the dtype 4-bit weights are dequantized to for each "
                                                          "matmul (default: the scenario's precision)")

    @model_validator(mode="after")
    def _settings_of_the_method(self) -> "FineTune":
        given = lambda names: [n for n in names if getattr(self, n) is not None]  # noqa: E731
        if self.method == "full" and (extra := given(_ADAPTER_FIELDS + _QUANT_FIELDS)):
            raise ValueError(f"method full trains every weight; only lora/qlora take {', '.join(extra)}")
        if self.method == "lora" and (extra := given(_QUANT_FIELDS)):
            raise ValueError(f"method lora keeps the base unquantized; only qlora takes {', '.join(extra)}")
        if self.method != "full":
            if missing := [n for n in ("rank", "alpha", "targets") if getattr(self, n) is None]:
                raise ValueError(f"method {self.method} needs {', '.join(missing)}")
            self.dropout = 0.0 if self.dropout is None else self.dropout
        if self.method == "lora" and self.base_dtype in ("nf4", "fp4"):
            raise ValueError(f"base_dtype {self.base_dtype} is a 4-bit base: use method qlora")
        if self.method == "qlora":
            self.quant_type = self.quant_type or "nf4"
            self.double_quant = True if self.double_quant is None else self.double_quant
            if self.base_dtype not in (None, self.quant_type):
                raise ValueError(f"method qlora stores the base in 4 bits ({self.quant_type}), not "
                                 f"{self.base_dtype}: leave base_dtype out or set quant_type")
            self.base_dtype = self.quant_type
        return self

    def summary(self, arch: ModelArch) -> str:
        """One line for `fbench show`: the method and every setting it trains with."""
        if self.method == "full":
            return "full: every weight trains"
        base = (f"base {self.base_dtype}" if self.method == "lora" else
                f"base {self.base_dtype} ({'double quant, ' if self.double_quant else ''}compute {self.compute_dtype})")
        return (f"{self.method} r={self.rank}, alpha {self.alpha:g} (scale {self.alpha / self.rank:g}), dropout "
                f"{self.dropout:g}, {base}, on {', '.join(self.targets)}; "
                f"{self.adapter_parameter_count(arch):,} adapter parameters")

    def adapter_parameter_count(self, arch: ModelArch) -> int:
        """The adapters' trainable parameters: per targeted linear (in -> out) of every layer,
        A (r x in) and B (out x r); 0 for full fine-tuning."""
        if self.method == "full":
            return 0
        shapes = arch.linear_shapes
        return arch.num_hidden_layers * sum(self.rank * sum(shapes[t]) for t in self.targets)

    def resolved(self, arch: ModelArch, precision: str) -> None:
        """Fills in what follows from the model and the precision: `all-linear` as the explicit
        list of the architecture's linear modules, the base (lora) and compute (qlora) dtypes."""
        if self.method == "full":
            return
        valid = list(arch.linear_shapes)
        if self.targets == ALL_LINEAR:
            self.targets = valid
        if unknown := [t for t in self.targets if t not in valid]:
            raise ValueError(f"finetune.targets: {', '.join(map(repr, unknown))} not a linear module of a "
                             f"{arch.architecture} decoder layer; valid: {', '.join(valid)} (or {ALL_LINEAR!r}; "
                             "the LM head is never a target)")
        if len(set(self.targets)) != len(self.targets):
            raise ValueError(f"finetune.targets: {self.targets} names a module twice")
        if self.method == "lora":
            self.base_dtype = self.base_dtype or precision
        else:
            self.compute_dtype = self.compute_dtype or precision
