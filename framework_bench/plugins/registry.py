"""The plugin manager: backends are found through the `fbench.backends` entry points only.

The bundled backends are registered by this project's own `pyproject.toml` entry points,
exactly as a third-party package would register one. An entry point names either a
subclass of `framework_bench.plugins.base.Backend` (registered as one instance of it) or,
as every plugin of the first contract does, any object holding the four hooks (a module of
module-level hooks, an instance): pluggy calls both alike, so this registry's
`RegisteredBackend` is the adapter that gives the run one surface for either form.
"""

from __future__ import annotations

import types
from collections.abc import Iterable
from functools import cached_property
from importlib.metadata import entry_points

import pluggy

from framework_bench.plugins import base, contract, hookspecs, pins
from framework_bench.plugins.contract import BackendEnv, BackendInfo, Job, LaunchPlan, Machine, WorkerReport
from framework_bench.scenario.scenario import Scenario


class UnknownBackend(LookupError):
    pass


class RegisteredBackend:
    """One registered backend, whichever form its plugin takes (a `base.Backend` instance, a
    module of hooks); calls its hooks (and only its hooks) through pluggy."""

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

    def refusal(self, scenario: Scenario) -> str | None:
        """Why it cannot run `scenario` by what it declares, whatever its env holds."""
        return self.info.capabilities.refusal(scenario, self.name)

    def check(self, scenario: Scenario, machine: Machine, env: BackendEnv) -> str | None:
        return self._call("fbench_check", scenario=scenario, machine=machine, env=env)

    def plan(self, job: Job, env: BackendEnv) -> LaunchPlan:
        return self._call("fbench_plan", job=job, env=env)

    def read_report(self, job: Job) -> WorkerReport:
        return self._call("fbench_read_report", job=job)


class PinnedBackend(RegisteredBackend):
    """A backend at a version (`plugins/pins.py`): its plugin's hooks under the spec's name, with
    an env of its own."""

    def __init__(self, plugin: RegisteredBackend, spec: str):
        super().__init__(plugin._pm, plugin._plugin)
        self.plugin, self.spec = plugin, spec

    @cached_property
    def info(self) -> BackendInfo:
        own = self.plugin.info
        return own.model_copy(update={"name": self.spec, "env": pins.requirements(self.spec, own.env)})

    @cached_property
    def outside(self) -> str | None:
        """Why its pins fall outside the releases its plugin supports (`EnvSpec.supports`), or None."""
        return pins.refusal(self.spec, self.plugin.info.env)

    def refusal(self, scenario: Scenario) -> str | None:
        return self.outside or super().refusal(scenario)


# Backends that are installed but broken, by entry-point name: an import error, a missing
# hook, or a `fbench_backend_info` that raises or returns something else. Shown by
# `fbench backends` and by `fbench run --backend NAME`, instead of letting one broken
# third-party package take the whole host down.
load_errors: dict[str, str] = {}

HOOKS = tuple(name for name in vars(hookspecs.TrainBackend) if name.startswith("fbench_"))


def _missing_hooks(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    implemented = {caller.name for caller in pm.get_hookcallers(plugin) or []}
    return [hook for hook in HOOKS if hook not in implemented]


# Where each registered plugin comes from, by entry-point name: "distribution (module:object)".
origins: dict[str, str] = {}


def _origin(ep) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name if dist is not None else 'an unknown distribution'} ({ep.value})"


def _plugin_object(loaded: object) -> object:
    """What pluggy registers for an entry point's object: a `base.Backend` subclass as its one instance."""
    return loaded() if isinstance(loaded, type) and issubclass(loaded, base.Backend) else loaded


# Managers already built, by the entry points they were built from: a command asks for the
# backends many times, and registering a plugin with pluggy costs milliseconds each time.
_built: dict[tuple, tuple[pluggy.PluginManager, dict[str, str], dict[str, str]]] = {}


def manager() -> pluggy.PluginManager:
    """A plugin manager with every working backend of the `fbench.backends` entry-point group.
    A name claimed by two distributions is broken for both: which one ran would depend on
    the order of sys.path, and its rows would be stored under a name that is not its own."""
    found = entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    key = tuple((ep.name, ep.value, _origin(ep), str(ep.dist.locate_file("")) if ep.dist else "") for ep in found)
    if key not in _built:
        errors: dict[str, str] = {}
        where: dict[str, str] = {}
        _built[key] = (_build(found, errors, where), errors, where)
    pm, errors, where = _built[key]
    load_errors.update(errors)
    origins.update(where)
    return pm


def _build(found, errors: dict[str, str], where: dict[str, str]) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs.TrainBackend)
    claims: dict[str, dict[str, object]] = {}
    for ep in found:
        claims.setdefault(ep.name, {}).setdefault(_origin(ep), ep)  # one distribution seen twice on sys.path is one
    for name, by_origin in claims.items():
        if len(by_origin) > 1:
            errors[name] = f"the name {name!r} is claimed by {' and '.join(sorted(by_origin))}: none of them runs; " \
                           "uninstall all but one"
            continue
        (origin, ep), = by_origin.items()
        where[name] = origin
        try:
            plugin = _plugin_object(ep.load())
            pm.register(plugin, name=ep.name)
        except Exception as e:  # noqa: BLE001 - any import/validation error of a plugin
            errors[ep.name] = f"{type(e).__name__}: {e}"
            continue
        missing = _missing_hooks(pm, plugin)
        if missing:
            pm.unregister(plugin)
            errors[ep.name] = f"missing hook{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return pm


def backends(pm: pluggy.PluginManager | None = None, pinned: Iterable[str] = ()) -> dict[str, RegisteredBackend]:
    """The working backends by name, and of `pinned` the backends at a version whose plugin works
    (a malformed one is broken, in `load_errors`). Two answering to one name, or two declaring themselves the
    reference, are broken all (`load_errors`): none is chosen by the order they sort in. So is one
    declaring a plugin contract this release does not run (`contract.window`)."""
    pm = pm or manager()
    by_name: dict[str, list[tuple[str, RegisteredBackend]]] = {}
    for name, plugin in pm.list_name_plugin():
        backend = RegisteredBackend(pm, plugin)
        try:
            info = backend.info
            if not isinstance(info, BackendInfo):
                raise TypeError(f"fbench_backend_info returned {type(info).__name__}, not BackendInfo")
        except Exception as e:  # noqa: BLE001 - a plugin's own bug: report it, keep the others
            load_errors[name] = f"{type(e).__name__}: {e}"
            continue
        if outside := contract.outside_window(info.contract):  # claims this host no longer judges, or not yet
            load_errors[name] = outside
            continue
        by_name.setdefault(info.name, []).append((name, backend))
    found = {}
    for name, claimants in sorted(by_name.items()):
        if len(claimants) > 1:  # two plugins answering to one name: neither's rows could be told apart
            who = " and ".join(f"entry point {ep} of {origins.get(ep, '?')}" for ep, _ in claimants)
            load_errors[name] = f"the backend name {name!r} is given by {who}: none of them runs; uninstall all but one"
            continue
        found[name] = claimants[0][1]
    references = {name: ep for name, claimants in by_name.items() if name in found
                  for ep, backend in claimants if backend.info.reference}
    if len(references) > 1:  # which would be the reference would depend on sort order: none is
        who = " and ".join(f"{name!r} (entry point {ep} of {origins.get(ep, '?')})"
                           for name, ep in sorted(references.items()))
        for name in references:
            del found[name]
            load_errors[name] = (f"the backends {who} each declare themselves the reference (BackendInfo.reference): "
                                 "none of them runs; uninstall all but one, or declare reference=False in yours")
    for spec in pinned:
        plugin = found.get(pins.plugin_name(spec))
        if pins.SEP in spec and plugin is not None:
            try:
                found[spec] = PinnedBackend(plugin, pins.canonical(spec, plugin.info.env.framework_package))
            except pins.BadSpec as e:
                load_errors[spec] = str(e)
    return found


def get(name: str, pm: pluggy.PluginManager | None = None) -> RegisteredBackend:
    found = backends(pm, [name])
    if name not in found:
        if name in load_errors:
            raise UnknownBackend(f"the backend {name!r} is installed but broken: {load_errors[name]}")
        raise UnknownBackend(f"no backend named {name!r}; installed: {', '.join(found) or 'none'}")
    return found[name]


def canonical(name: str) -> str:
    """A backend name as stored: a backend at a version spelled as `pins.canonical` spells it
    (a malformed one raises `pins.BadSpec`); any other name as given."""
    plugin = backends().get(pins.plugin_name(name)) if pins.SEP in name else None
    return pins.canonical(name, plugin.info.env.framework_package) if plugin is not None else name
