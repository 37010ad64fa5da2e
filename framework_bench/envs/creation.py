"""Creating a backend's env: built beside the old one, swapped in once complete, recorded last.

Creating again with unchanged requirements and options only refreshes the host packages made
importable in it (`host_packages`). A creation that fails or is interrupted leaves the old env
as it was; one that was killed is cleaned up by the next (`sweep_building`), whatever that one
then has to do.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

from framework_bench.envs import site_layers
from framework_bench.envs.children import dies_with_this_process
from framework_bench.envs.errors import EnvError
from framework_bench.envs.host_packages import link_packages
from framework_bench.envs.pip_options import Options, pip_argv, validate
from framework_bench.envs.sdk_check import sdk_import_error
from framework_bench.envs.smoke import smoke_test
from framework_bench.envs.torch_index import default_flavour, driver_cuda_version, torch_index_for
from framework_bench.envs.venvs import (RECORD, STALE_PLUGIN, Flavour, env_path, env_python, inspect,
                                        installed_versions, requirements_hash)
from framework_bench.plugins.contract import BackendEnv, EnvSpec


def create(
    name: str,
    spec: EnvSpec,
    flavour: Flavour | None = None,
    say: Callable[[str], None] = lambda msg: None,
    packages: tuple[str, ...] = (),
    options: Options | None = None,
    over: BackendEnv | None = None,
) -> BackendEnv:
    """Create (or reuse) the env of backend `name`; idempotent. `packages` are the plugin's
    top-level import packages its worker needs (besides `framework_bench`). `over`: a ready env
    whose packages it sees behind its own (a backend at a version over its plugin's env: pip
    installs only what the pins change).

    The new env is built in a temporary folder beside the old one and swapped in only once
    it is complete: a failed or interrupted creation leaves the old env as it was."""
    options = options or Options()
    validate(flavour, options)
    flavour = flavour or default_flavour()
    for stale in sweep_building(name):  # first: an env found ready now still leaves nothing of a killed creation
        say(f"{name}: removed {stale}, left by a creation that was killed")
    current = inspect(name, spec)
    record_file = current.path / RECORD
    old_options = json.loads(record_file.read_text()).get("options", {}) if record_file.exists() else None
    if current.flavour == flavour and old_options == options.model_dump() and (
            current.ready or current.problem.startswith(STALE_PLUGIN)):
        record = json.loads(record_file.read_text())
        record["linked"] = link_packages(current.python, ("framework_bench", *packages))
        _write_record(current.path, record)
        say(f"{name}: ready at {current.path} (" + ("nothing to do" if current.ready else "plugin copy refreshed") + ")")
        return inspect(name, spec)
    torch_index = options.torch_index
    if flavour == "cuda" and torch_index is None:
        torch_index = torch_index_for(driver_cuda_version())
    requirements = Path(options.requirements) if options.requirements else spec.requirements[flavour]
    path = env_path(name)
    building = path.with_name(f".{name}.building-{os.getpid()}")
    if building.exists():
        shutil.rmtree(building)
    building.mkdir(parents=True)
    started = time.monotonic()
    python = env_python(building)
    log_path = path.with_name(f"{name}.create.log")
    try:
        with log_path.open("w") as log:
            say(f"{name}: creating venv in {building} (swapped in for {path} when complete)")
            venv = [sys.executable, "-m", "venv", "--prompt", name, str(building)]
            # A venv host's own packages are what "the system's" means here (site_layers says why).
            layered = (options.system_site_packages and site_layers.is_venv()) or over is not None
            _run(venv + (["--system-site-packages"] if options.system_site_packages and not layered else []), log)
            inherited = site_layers.inherit(python, over.python if over is not None else None) if layered else None
            say(f"{name}: pip install -r {requirements.name} (a few minutes)"
                + (f", torch from {torch_index}" if torch_index else ""))
            # pip, not uv: only pip sees the local CPU torch build this machine offers.
            _run(pip_argv(python, requirements, options, torch_index), log)
            linked = link_packages(python, ("framework_bench", *packages))
        aside = _swap_in(building, path)
    except BaseException:  # a failure or Ctrl-C: the old env stays, the half-built one goes
        shutil.rmtree(building, ignore_errors=True)
        raise
    # At the final path, with the old env kept aside until the new one is complete: a post-install
    # step may build what names the env's folders (DeepSpeed's JIT ops, see plugins/deepspeed_jit).
    try:
        with log_path.open("a") as log:
            for module in spec.post_install:
                say(f"{name}: post-install {module}")
                _run([str(env_python(path)), "-m", module, flavour], log, cwd=path)
            smoke = None
            if flavour == "cuda":
                smoke = smoke_test(env_python(path), gpu_here=driver_cuda_version() is not None)
                say(f"{name}: smoke test {smoke['status']}")
                if smoke["status"] == "failed":
                    raise EnvError(f"the cuda env's smoke test failed: {smoke}; see {log_path}")
            # Before "ready": an env whose worker cannot import the SDK would fail every run.
            sdk_error = sdk_import_error(env_python(path))
            log.write(f"worker SDK import: {sdk_error or 'ok'}\n")
            if sdk_error:
                raise EnvError(f"the worker SDK (framework_bench.worker) does not import in the {name} env: {sdk_error}; "
                               f"see {log_path}")
        record = {
            "name": name,
            "flavour": flavour,
            "requirements": str(requirements),
            "requirements_sha256": requirements_hash(spec, flavour),
            "options": options.model_dump(),
            # resolved: a FBENCH_HOME whose envs folder is a link (a test's) names the env that stays
            "over": str(over.path.resolve()) if over is not None else None,
            "torch_index": torch_index,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.monotonic() - started, 1),
            "host_python": sysconfig.get_python_version(),
            "site_dirs": inherited if layered else _site_dirs(env_python(path)) if options.system_site_packages else [],
            "smoke_test": smoke,
            "sdk_import": "ok",
            "linked": linked,
            "versions": installed_versions(path),
        }
        shutil.copy2(log_path, path / "create.log")
        _write_record(path, record)  # last: the env is ready from here on
    except BaseException:  # the new env goes and the old one comes back, as if never swapped
        shutil.rmtree(path, ignore_errors=True)
        if aside is not None:
            aside.rename(path)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
    say(f"{name}: ready in {record['seconds']:.0f} s")
    return inspect(name, spec)


def create_backend(backend, flavour: Flavour | None = None, say: Callable[[str], None] = lambda msg: None,
                   options: Options | None = None) -> BackendEnv:
    """`create` for a registered backend: one at a version (`plugins/pins.py`) over its plugin's env,
    that one made first where it is not ready, and never outside the releases its plugin supports."""
    from framework_bench.plugins.registry import PinnedBackend

    over = None
    if isinstance(backend, PinnedBackend):
        if backend.outside:
            raise EnvError(backend.outside)
        over = inspect(backend.plugin.name, backend.plugin.info.env)
        if not over.ready:
            over = create_backend(backend.plugin, flavour, say, options)
        flavour = over.flavour
    return create(backend.name, backend.info.env, flavour, say=say, packages=(backend.package,), options=options,
                  over=over)


def sweep_building(name: str) -> list[Path]:
    """Clean up after a creation that was killed before it could: remove its half-built env
    (`.NAME.building-PID`, gigabytes for a real one), and where it died between the swap and
    the new env's record (`.NAME.old-PID` beside an env without one), put the old env back.
    A live pid's folders stay; what still runs from a dead one's is ended first."""
    removed = []
    path = env_path(name)
    for folder in sorted(path.parent.glob(f".{name}.building-*")) + sorted(path.parent.glob(f".{name}.old-*")):
        pid = folder.name.rsplit("-", 1)[1]
        if not (pid.isascii() and pid.isdigit()) or Path(f"/proc/{pid}").exists():
            continue
        _end_processes_of(folder)
        if folder.name.startswith(f".{name}.old-") and not (path / RECORD).exists():
            shutil.rmtree(path, ignore_errors=True)
            folder.rename(path)
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _swap_in(building: Path, path: Path) -> Path | None:
    """Replace `path` by the built env; returns where the old env was moved aside (None if there
    was none), for the caller to remove once the new one is complete or to move back. A venv's
    scripts and activate files name the folder they were made in: rewritten to the final path
    before the swap."""
    old, new = str(building).encode(), str(path).encode()
    for f in (building / "bin").iterdir():
        if f.is_file() and not f.is_symlink():
            data = f.read_bytes()
            if old in data[:4096] or (f.name.startswith("activate") and old in data):
                f.write_bytes(data.replace(old, new))
    aside = path.with_name(f".{path.name}.old-{os.getpid()}")
    if path.exists():
        path.rename(aside)
    building.rename(path)
    return aside if aside.exists() else None


def _end_processes_of(folder: Path) -> None:
    """SIGKILL what still runs from a dead creation's folder: pip's build steps (its children, run
    by the env's Python there, so their command lines name the folder) outlive a pip that died."""
    mark = os.fsencode(folder) + b"/"
    try:
        pids = [e for e in os.listdir("/proc") if e.isascii() and e.isdigit()]
    except OSError:  # no /proc: nothing to find
        return
    for pid in pids:
        try:
            if mark in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except OSError:  # gone meanwhile, or not ours to read
            continue




def _run(argv: list[str], log, **kw) -> None:
    """One step of the build, its output to `log`. It leads a process group of its own, killed
    whole when the creation stops under it (Ctrl-C, SIGTERM: pip's build steps are its children),
    and the kernel kills it should fbench die first (`children.dies_with_this_process`); a build step that
    outlives it is ended by the next creation (`sweep_building`)."""
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=dies_with_this_process(), **kw)
    try:
        code = proc.wait()
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # not waited for yet: the group's id is still its leader's
        except ProcessLookupError:
            pass
        proc.wait()
        raise
    if code:
        log.flush()
        # pip's own words (a release no index offers here, say) lead, the log's path after
        said = [line.strip() for line in Path(log.name).read_text(errors="replace").splitlines() if line.startswith("ERROR:")]
        raise EnvError(f"`{' '.join(argv[:4])} ...` exited {code}" + (f": {said[-1]}" if said else "") + f"; see {log.name}")


def _site_dirs(python: Path) -> list[str]:
    """The site-packages folders outside the env that its Python also reads (--system-site-packages)."""
    out = subprocess.run([str(python), "-c", "import json, site, sys; print(json.dumps([p for p in site.getsitepackages()"
                          " if not p.startswith(sys.prefix)]))"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _write_record(path: Path, record: dict) -> None:
    """Replace the env's record at once: a concurrent `inspect` never reads half of it."""
    tmp = path / f"{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path / RECORD)
