"""What NVML says of a run's GPUs while it goes: busy samples and energy, through
`nvidia-smi` (the host has no NVML binding). Recorded beside the host's clock
(`framework_bench/measure/clock.py`), never judged; unreadable, it says why.
"""

from __future__ import annotations

import subprocess
import threading
import time

QUERY = "index,utilization.gpu,total_energy_consumption"  # %, mJ since the driver loaded
PERIOD_MS = 200


class NvmlSampler:
    """What NVML says of the GPUs while the run goes (`nvidia-smi` sampling every
    `PERIOD_MS`, each line stamped on arrival like a clock line): busy samples and
    energy. Recorded, never judged; unreadable, it says why."""

    def __init__(self, gpus: str):
        self.gpus, self.samples, self.problem = gpus, [], None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        argv = ["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits", "-lms", str(PERIOD_MS)]
        try:
            self._proc = subprocess.Popen(argv + ([] if self.gpus == "all" else ["-i", self.gpus]), text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        except OSError as e:
            self.problem = f"nvidia-smi cannot run: {e.strerror or e}"
            return
        self._thread = threading.Thread(target=self._read, name="fbench-nvml", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            stamp = time.monotonic()
            fields = [f.strip() for f in line.split(",")]
            if len(fields) != 3 or not (fields[0].isascii() and fields[0].isdigit()):
                continue
            self.samples.append([stamp, int(fields[0]), _number(fields[1]), _number(fields[2])])

    def stop(self) -> dict:
        if self._proc:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)
            if not self.samples:
                self.problem = f"nvidia-smi gave no samples (exit {self._proc.returncode})"
        return {"samples": self.samples, "problem": self.problem}


def _number(field: str) -> float | None:
    try:
        return float(field)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def nvml_figures(nvml: dict | None, begin: float, stop: float) -> dict:
    """Busy share and energy over [begin, stop] from the samples; "unavailable" where none."""
    if not nvml:
        return {}
    inside = [s for s in nvml["samples"] if begin <= s[0] <= stop]
    busy = [s[2] for s in inside if s[2] is not None]
    if not busy:
        return {"nvml": f"unavailable: {nvml['problem'] or 'no sample inside the measured steps'}"}
    energy: float | None = 0.0
    for gpu in {s[1] for s in inside}:
        millijoules = [s[3] for s in inside if s[1] == gpu and s[3] is not None]
        if len(millijoules) < 2:  # a GPU without an energy counter: no total
            energy = None
            break
        energy += (millijoules[-1] - millijoules[0]) / 1e3
    return {"nvml_busy_percent": round(sum(busy) / len(busy), 1), "nvml_samples": len(busy),
            "nvml_energy_joules": None if energy is None else round(energy, 1)}
