"""Third-party backends that lie: each is the torch reference backend whose worker carries
one named lie (`fbench_lying_worker.LIES`), at most 15 lines changed from the real worker.

They are what a framework vendor with an incentive to look fast could install: registered
through the `fbench.backends` entry points (`register_through_entry_points`) like any other
plugin, launched with the torch env's Python, read back as the torch plugin reads its runs (they
subclass it). The honest copy (`lying_honest`, no lie) must end `ok` beside them.
"""

from __future__ import annotations

import os
from pathlib import Path

from fbench_torch import plugin as torch_plugin

from framework_bench.envs import venvs as envs
from framework_bench.plugins.contract import BackendEnv

from fbench_lying_worker import LIES

HERE = Path(__file__).resolve().parent


def torch_env() -> BackendEnv:
    """The torch backend's env: every liar runs in it (a copy of the torch loop needs nothing else)."""
    return envs.inspect(torch_plugin.NAME, torch_plugin.TorchBackend().info().env)


class LyingBackend(torch_plugin.TorchBackend):
    def __init__(self, lie: str, module: str = "fbench_lying_worker", env: dict[str, str] | None = None, **info_fields):
        self.lie, self.module = lie, module  # the worker module that runs the lie
        self.env = env or {}  # set for the worker on top of the reference's
        self.info_fields = info_fields

    def info(self):
        return super().info().model_copy(update={"name": self.name, "framework": f"PyTorch, lying: {self.lie}", "reference": False,
                                                 **self.info_fields})

    def check(self, scenario, machine, env):
        return super().check(scenario, machine, torch_env())

    def plan(self, job, env):
        plan = super().plan(job, torch_env())
        path = os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])
        return plan.model_copy(update={"module": self.module, "args": [str(job.job_file), self.lie],
                                       "env": {**plan.env, "PYTHONPATH": path, **self.env}})

    @property
    def name(self) -> str:
        return f"lying_{self.lie}" + (f"_contract{self.info_fields['contract']}" if "contract" in self.info_fields else "")


# Each lie at the current contract (the torch plugin's), the claimless one and the honest copy
# also as plugins of contract 1, written before the claims were required, the worker
# without the update claim as a plugin of contract 2, written before that claim.
BACKENDS = ([LyingBackend(lie) for lie in LIES] + [LyingBackend(lie, contract=1) for lie in ("honest", "no_claims")]
            + [LyingBackend("no_update_claim", contract=2)])
globals().update({backend.name: backend for backend in BACKENDS})
ENTRY_POINTS = {backend.name: f"fbench_lying_backends:{backend.name}" for backend in BACKENDS}


def register_through_entry_points(site: Path, entry_points: dict[str, str] | None = None,
                                  distribution: str = "fbench-lying-backends") -> None:
    """Write a dist-info into `site` declaring the lying backends (or `entry_points`);
    put `site` on sys.path to install them."""
    info = site / f"{distribution.replace('-', '_')}-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0\n")
    lines = ["[fbench.backends]"] + [f"{name} = {target}" for name, target in (entry_points or ENTRY_POINTS).items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
