"""The ceiling a CPU run's FLOPs are held to: this machine's peak, read from the machine itself.

An upper bound, generous on purpose: a real run must never exceed it, so every guess is the
high one. peak FLOP/s = logical CPUs x clock x FLOPs per cycle of one core, with

- logical CPUs: every CPU of the process's cpuset (cgroup v2 `cpuset.cpus.effective`, v1
  `cpuset.effective_cpus`, found through /proc/self/cgroup), or of its affinity
  (`os.sched_getaffinity`), whichever is more: a worker can widen its affinity up to its
  cpuset, never beyond. SMT siblings count as full cores (they share one core's vector units,
  so this doubles the bound on SMT machines). A CFS quota (`cpu.max`, `cpu.cfs_quota_us`) is
  not used: it is enforced per period (100 ms by default), and a step shorter than that can run
  on every CPU of the cpuset before the quota throttles it.
- clock: the highest `cpuinfo_max_freq` of /sys/devices/system/cpu/cpu*/cpufreq, which is the
  turbo clock for intel_pstate, amd-pstate, cppc and the Arm drivers. acpi-cpufreq with boost
  reports base + 1 MHz instead, and a VM or container often has no cpufreq at all (its
  /proc/cpuinfo "cpu MHz" and the model name's "@ x GHz" are the base clock): then the turbo
  clock is unknown and MAX_SHIPPED_GHZ stands in, or the clock read there if it is higher.
- FLOPs per cycle of one core: fp32 lanes x FMA units x 2 (a fused multiply-add is two FLOPs).
  x86, from /proc/cpuinfo `flags`: avx512f 16 lanes, avx (avx2/fma) 8, else SSE's 4, with 2 FMA
  units a core (Intel since Haswell, AMD since Zen 2; 1-unit AVX-512 parts and Zen 4's
  double-pumped AVX-512 are counted at 2 full units). bf16: `amx_bf16` 1024 FLOPs a cycle
  (Intel's AMX: 1024 bf16 operations per cycle per core, against the 64 fp32 FLOPs of AVX-512's
  two FMA units), `avx512_bf16` twice the fp32 rate (VDPBF16PS: two products per fp32 lane),
  else bf16 is computed in fp32 (converted) at the fp32 rate. aarch64, from `Features`:
  NEON (asimd) 4 lanes x 4 FP pipes (Neoverse V2, Apple), SVE counted at 512-bit vectors
  (A64FX, the widest shipped) x 2 pipes, `bf16` (BFMMLA: 4 products a lane) 4x the fp32 rate.
  A CPU with SME, or of another architecture, has no ceiling here: its matrix rate is not known.

Sources: Intel 64 and IA-32 Architectures Optimization Reference Manual (FMA ports, AMX TMUL
throughput), AMD Zen 4/5 software optimization guides, the Arm Neoverse V1/V2 software
optimization guides, the Linux cpufreq documentation (Documentation/admin-guide/pm/cpufreq.rst:
cpuinfo_max_freq) and cgroup-v2.rst (cpuset.cpus.effective, cpu.max).
"""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

Precision = Literal["bf16", "fp32"]

# The fastest boost clock a shipped CPU is sold with (Intel Core i9-14900KS, 6.2 GHz): the clock
# assumed where the machine does not say its turbo clock.
MAX_SHIPPED_GHZ = 6.2
FMA_UNITS_X86 = 2
AMX_BF16_FLOPS_PER_CYCLE = 1024
NEON_PIPES, NEON_LANES = 4, 4
SVE_PIPES, SVE_LANES = 2, 16  # 512-bit vectors


class CpuPeak(BaseModel):
    """One machine's CPU ceiling and what it was read from."""

    model: str
    cpus: int  # logical CPUs the run could use
    ghz: float
    clock_source: str  # where `ghz` comes from
    fp32_flops_per_cycle: float  # per logical CPU
    bf16_flops_per_cycle: float
    fp32_units: str  # how the per-cycle figure was made, e.g. "avx512f: 16 fp32 lanes x 2 FMA units x 2"
    bf16_units: str

    def flops_per_cycle(self, precision: Precision) -> float:
        return self.bf16_flops_per_cycle if precision == "bf16" else self.fp32_flops_per_cycle

    def tflops(self, precision: Precision) -> float:
        return self.cpus * self.ghz * 1e9 * self.flops_per_cycle(precision) / 1e12

    def describe(self, precision: Precision) -> str:
        return (f"{self.tflops(precision):.3g} TFLOPs {precision}: {self.model}, {self.cpus} logical CPUs x "
                f"{self.ghz:g} GHz ({self.clock_source}) x {self.flops_per_cycle(precision):g} FLOPs/cycle "
                f"({self.bf16_units if precision == 'bf16' else self.fp32_units})")


def cpuinfo_fields(text: str) -> dict[str, str]:
    """The fields of the first processor in a /proc/cpuinfo text (x86 and aarch64 name them alike)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:
            fields[key.strip()] = value.strip()
    return fields


def flops_per_cycle(fields: dict[str, str]) -> tuple[float, float, str, str] | str:
    """(fp32, bf16 FLOPs per cycle of one core, how each was made) from /proc/cpuinfo's fields, or why unknown."""
    if "flags" in fields:  # x86
        flags = set(fields["flags"].split())
        lanes, isa = ((16, "avx512f") if "avx512f" in flags else (8, "avx") if "avx" in flags else (4, "sse"))
        fp32 = lanes * FMA_UNITS_X86 * 2
        how = f"{isa}: {lanes} fp32 lanes x {FMA_UNITS_X86} FMA units x 2"
        if "amx_bf16" in flags:
            return fp32, max(AMX_BF16_FLOPS_PER_CYCLE, 2 * fp32), how, "amx_bf16: the AMX tile unit"
        if "avx512_bf16" in flags:
            return fp32, 2 * fp32, how, "avx512_bf16: 2 products per fp32 lane, " + how
        return fp32, fp32, how, "computed in fp32, " + how
    if "Features" in fields:  # aarch64
        features = set(fields["Features"].split())
        if "sme" in features:
            return "the CPU has SME, whose matrix rate is not known here"
        fp32, how = NEON_LANES * NEON_PIPES * 2, f"asimd: {NEON_LANES} fp32 lanes x {NEON_PIPES} pipes x 2"
        if "sve" in features:  # 2 x 512 bits outruns 4 x 128
            fp32, how = SVE_LANES * SVE_PIPES * 2, f"sve at 512 bits: {SVE_LANES} fp32 lanes x {SVE_PIPES} pipes x 2"
        if "bf16" in features:
            return fp32, 4 * fp32, how, "bf16 (bfmmla): 4 products per fp32 lane, " + how
        return fp32, fp32, how, "computed in fp32, " + how
    return "/proc/cpuinfo names neither x86 flags nor Arm features"


def _ghz_in_cpuinfo(fields: dict[str, str]) -> float | None:
    """The highest clock /proc/cpuinfo states: its "cpu MHz" or the model name's "@ 2.10GHz"."""
    found = []
    if mhz := re.fullmatch(r"\d+(\.\d+)?", fields.get("cpu MHz", "")):
        found.append(float(mhz.group()) / 1000)
    if named := re.search(r"(\d+(\.\d+)?)\s*GHz", fields.get("model name", "")):
        found.append(float(named.group(1)))
    return max(found, default=None)


def clock(sysfs: Path, fields: dict[str, str]) -> tuple[float, str]:
    """(GHz, its source): the turbo clock cpufreq reports, else the fastest shipped one."""
    cpu = sysfs / "devices/system/cpu"
    khz = []
    for path in cpu.glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        try:
            khz.append(int(path.read_text().strip()))
        except (OSError, ValueError):
            continue
    driver = _read(cpu / "cpu0/cpufreq/scaling_driver")
    boost_hidden = driver == "acpi-cpufreq" and (cpu / "cpufreq/boost").exists()
    if khz and not boost_hidden:
        return max(khz) / 1e6, "cpuinfo_max_freq"
    stated = _ghz_in_cpuinfo(fields)
    why = "acpi-cpufreq hides the boost clock" if boost_hidden else "no cpufreq"
    if stated and stated > MAX_SHIPPED_GHZ:
        return stated, f"{why}: /proc/cpuinfo's clock"
    return MAX_SHIPPED_GHZ, f"{why}: the fastest shipped turbo clock"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_list_size(text: str) -> int:
    """How many CPUs a Linux CPU list ("0-3,8,10-11") names."""
    total = 0
    for part in filter(None, text.strip().split(",")):
        first, _, last = part.partition("-")
        total += int(last or first) - int(first) + 1
    return total


def cpus(proc: Path, sysfs: Path) -> int:
    """The logical CPUs any process of the run can be scheduled on: its cpuset, or its affinity."""
    counts = [len(os.sched_getaffinity(0))] if hasattr(os, "sched_getaffinity") else [os.cpu_count() or 1]
    for line in (_read(proc / "self/cgroup") or "").splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0":
            found = _read(sysfs / "fs/cgroup" / path.lstrip("/") / "cpuset.cpus.effective")
        elif "cpuset" in controllers.split(","):
            found = _read(sysfs / "fs/cgroup/cpuset" / path.lstrip("/") / "cpuset.effective_cpus")
        else:
            continue
        try:
            counts.append(cpu_list_size(found or ""))
        except ValueError:
            continue
    return max(counts)


def read(proc: Path = Path("/proc"), sysfs: Path = Path("/sys")) -> CpuPeak | str:
    """This machine's CPU ceiling, or why it cannot be read (a sentence)."""
    try:
        fields = cpuinfo_fields((proc / "cpuinfo").read_text(errors="replace"))
    except OSError as e:
        return f"{proc / 'cpuinfo'} cannot be read ({e.strerror or e})"
    per_cycle = flops_per_cycle(fields)
    if isinstance(per_cycle, str):
        return per_cycle
    fp32, bf16, fp32_units, bf16_units = per_cycle
    ghz, source = clock(sysfs, fields)
    model = fields.get("model name") or (f"Arm CPU part {fields['CPU part']}" if "CPU part" in fields else "unnamed CPU")
    return CpuPeak(model=model, cpus=cpus(proc, sysfs), ghz=ghz, clock_source=source,
                   fp32_flops_per_cycle=fp32, bf16_flops_per_cycle=bf16,
                   fp32_units=fp32_units, bf16_units=bf16_units)


@cache
def this_machine() -> CpuPeak | str:
    return read()
