"""What is checked before anything is launched, so that no training is lost to it after: every
place a run writes can take files now, no run folder's name is longer than a file name may be, and
the launcher can start each scenario's processes. Each check says why not, or None; `refusal`
is a campaign's."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from framework_bench.data.packing import cache_root
from framework_bench.plugins import registry as plugins
from framework_bench.run.pipeline import new_run_dir, runs_root
from framework_bench.store.results import ResultsError


class Refused(Exception):
    """A campaign that cannot start: the user's to fix, said in one line before anything runs."""


def unwritable(path: Path, what: str) -> str | None:
    """Why the `what` folder `path` (made where missing) cannot take files, or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fbench-write-check-"):
            pass
    except OSError as e:
        return f"cannot write to the {what} folder {path}: {e.strerror or e}"
    return None


def unwritable_places(store, out: Path | None = None) -> str | None:
    """The first place a run writes that cannot take it now: the results store, the run folders,
    the packed-data cache, and `out` (--out: the charts and the report)."""
    try:
        store.check_writable()
    except ResultsError as e:
        return str(e)
    places = [(runs_root(), "run"), (cache_root(), "packed-data cache")] + ([(out, "--out")] if out is not None else [])
    return next((problem for path, what in places if (problem := unwritable(path, what))), None)


def overlong_run_folder(backend_names: list[str], scenarios: list) -> str | None:
    """A run folder, named `<time>-<scenario>-<backend>-<n>` (`pipeline.new_run_dir`), longer than a
    file name may be where it would be made: a plugin's name is not bounded as a scenario's is.
    Names no backend has are left to the run's own error."""
    found = plugins.backends(pinned=backend_names)
    folder = runs_root()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        limit = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255  # Linux's NAME_MAX
    for s in scenarios:
        for name in (b for b in backend_names if b in found):
            size = len(os.fsencode(new_run_dir(name, s, folder).name))
            if size > limit:
                return (f"the backend {name[:40]!r}{'…' if len(name) > 40 else ''} ({len(os.fsencode(name))} bytes) on "
                        f"{s.name} would write to a run folder whose name is {size} bytes, over the {limit} a file name "
                        "may have there: the backend needs a shorter name (BackendInfo.name)")
    return None


def refusal(request, reference: str | None) -> str | None:
    """Why a campaign's `request` (`campaign.Request`) cannot start, or None: a multi-process
    scenario under --launcher local, or a run folder's name too long (`reference`: the reference
    backend, run beside the others). The places it writes are checked once the store is open
    (`unwritable_places`)."""
    if request.options.launcher == "local":
        if s := next((s for s in request.scenarios if s.cluster.gpus > 1), None):
            return f"{s.name} runs {s.cluster.gpus} processes; --launcher local runs one: use torchrun (the default)"
    if problem := overlong_run_folder([*request.backends, *([reference] if reference else [])], request.scenarios):
        return problem
    return None
