"""The plugin manager: backends are found through the `fbench.backends` entry points only.

The bundled backends are registered by this project's own `pyproject.toml` entry points,
exactly as a third-party package would register one.
"""

from __future__ import annotations

import types
from functools import cached_property
from importlib.metadata import entry_points

import pluggy

from framework_bench import hookspecs
from framework_bench.backend import BackendEnv, BackendInfo, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.scenario import Scenario


class UnknownBackend(LookupError):
    pass


class Backend:
    """One registered backend; calls its hooks (and only its hooks) through pluggy."""

    def __init__(self, pm: pluggy.PluginManager, plugin: object):
        self._pm = pm
        self._plugin = plugin

    def _call(self, hook: str, **kwargs):
        others = [p for p in self._pm.get_plugins() if p is not self._plugin]
        return self._pm.subset_hook_caller(hook, remove_plugins=others)(**kwargs)

    @cached_property
    def info(self) -> BackendInfo:
        return self._call("fbench_backend_info")

    @property
    def package(self) -> str:
        """The plugin's top-level import package (its worker module lives under it)."""
        plugin = self._plugin
        module = plugin.__name__ if isinstance(plugin, types.ModuleType) else type(plugin).__module__
        return module.split(".")[0]

    @property
    def name(self) -> str:
        return self.info.name

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        return self._call("fbench_check", scenario=scenario, machine=machine, env=env)

    def plan(self, job: Job, env: BackendEnv) -> LaunchPlan:
        return self._call("fbench_plan", job=job, env=env)

    def read_report(self, job: Job) -> WorkerReport:
        return self._call("fbench_read_report", job=job)


# Entry points that failed to load, by name: shown by `fbench backends` instead of
# letting one broken third-party package take the whole host down.
load_errors: dict[str, str] = {}


def manager() -> pluggy.PluginManager:
    """A plugin manager with every backend of the `fbench.backends` entry-point group."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs.TrainBackend)
    for ep in entry_points(group=hookspecs.ENTRY_POINT_GROUP):
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            pm.register(ep.load(), name=ep.name)
        except Exception as e:  # noqa: BLE001 - any import/validation error of a plugin
            load_errors[ep.name] = f"{type(e).__name__}: {e}"
    return pm


def backends(pm: pluggy.PluginManager | None = None) -> dict[str, Backend]:
    pm = pm or manager()
    found = [Backend(pm, p) for p in pm.get_plugins()]
    return {b.name: b for b in sorted(found, key=lambda b: b.name)}


def get(name: str, pm: pluggy.PluginManager | None = None) -> Backend:
    found = backends(pm)
    if name not in found:
        raise UnknownBackend(f"no backend named {name!r}; installed: {', '.join(found) or 'none'}")
    return found[name]
