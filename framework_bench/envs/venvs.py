"""One virtual environment per backend, made and reused by the project.

XTuner 0.2.0 pins transformers==4.48.0 and LLaMA-Factory 0.9.5 needs >=4.55: no single
environment holds both, so each backend's worker runs with its own env's Python.

Layout: `<state folder>/envs/<backend>/` (`FBENCH_HOME`, else as `framework_bench/spec/places.py` says), with
`fbench-env.json` recording the flavour, the requirements hash, the resolved versions, how long
creation took, that the worker SDK imports there, and the host packages made importable in it
(a copied plugin's version and source hash: `inspect` calls the env stale once the host's plugin
differs). Creating again with unchanged requirements only refreshes those packages.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from framework_bench.envs import site_layers
from framework_bench.plugins.contract import BackendEnv, EnvSpec
from framework_bench.spec import places

RECORD = "fbench-env.json"
PTH_NAME = "fbench_host.pth"
COPY_MARK = ".fbench-copy"  # in a package folder `_link_packages` copied into an env
STALE_PLUGIN = "stale: plugin changed since env create"  # its copy in the env: `env create` refreshes it
Flavour = Literal["cpu", "cuda"]


class EnvError(RuntimeError):
    pass


def fbench_home() -> Path:
    """The state folder: see `framework_bench/spec/places.py`."""
    return places.state_dir()


def env_path(name: str) -> Path:
    return fbench_home() / "envs" / name


FLAVOURS: tuple[Flavour, ...] = ("cpu", "cuda")

# PyTorch's wheel indexes by CUDA build, newest first. PyPI's own torch 2.13.0 is the
# CUDA 13.0 build; a driver that supports less takes the newest index it can run.
# Assumed, not checked here (no network to the indexes, no GPU): that torch 2.13.0 is
# published on each of them; `--torch-index URL` overrides the choice.
TORCH_INDEXES = ((13, 0, None), (12, 8, "https://download.pytorch.org/whl/cu128"),
                 (12, 6, "https://download.pytorch.org/whl/cu126"))


class Options(BaseModel):
    """How pip builds the env, beyond the requirements file; recorded, and a change rebuilds."""

    find_links: list[str] = Field(default_factory=list, description="wheelhouse folders (offline installs)")
    no_index: bool = False
    with_specs: list[str] = Field(default_factory=list, description="extra requirement specs or wheel paths")
    system_site_packages: bool = False
    no_deps: bool = Field(False, description="install exactly what is listed, no dependency resolution")
    torch_index: str | None = Field(None, description="extra wheel index for torch (cuda flavour)")
    requirements: str | None = Field(None, description="a requirements file replacing the flavour's own")


def default_flavour() -> Flavour:
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def driver_cuda_version(run=subprocess.run) -> tuple[int, int] | None:
    """The CUDA version this machine's driver supports, from nvidia-smi's banner; None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_driver_cuda(out)


def parse_driver_cuda(nvidia_smi_output: str) -> tuple[int, int] | None:
    match = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", nvidia_smi_output)
    return (int(match[1]), int(match[2])) if match else None


def torch_index_for(driver_cuda: tuple[int, int] | None) -> str | None:
    """The torch wheel index for a driver: PyPI (None) when it runs CUDA 13 builds or when no
    driver is seen (a login node: the build is for the compute nodes), else the newest older
    CUDA build it supports. A driver older than every build is an error, before anything is built."""
    if driver_cuda is None:
        return None
    for major, minor, index in TORCH_INDEXES:
        if driver_cuda >= (major, minor):
            return index
    oldest = TORCH_INDEXES[-1]
    raise EnvError(f"this machine's driver supports CUDA {driver_cuda[0]}.{driver_cuda[1]}; torch 2.13 "
                   f"needs CUDA {oldest[0]}.{oldest[1]} or newer: update the driver or pass --torch-index")


def _python(path: Path) -> Path:
    return path / "bin" / "python"


def _requirements_hash(spec: EnvSpec, flavour: Flavour) -> str:
    return hashlib.sha256(spec.requirements[flavour].read_bytes()).hexdigest()


def inspect(name: str, spec: EnvSpec | None = None) -> BackendEnv:
    """The env as found on disk; `ready` only if it was completed, still matches its requirements,
    holds the worker SDK's requirements and its copies of host packages match the host's."""
    path = env_path(name)
    env = BackendEnv(name=name, path=path, python=_python(path))
    record_file = path / RECORD
    if not record_file.exists():
        env.problem = "not created (run `fbench env create %s`)" % name
        return env
    try:
        record = json.loads(record_file.read_text())
        env.flavour = record["flavour"]
        made_from = record.get("requirements_sha256")
        site_dirs = list(record.get("site_dirs", []))
        linked = dict(record.get("linked") or {})  # absent from an env made before fbench recorded it
        if env.flavour not in ("cpu", "cuda"):
            raise ValueError(env.flavour)
    except (OSError, ValueError, KeyError, TypeError) as e:  # a damaged record: remade, never a traceback
        env.flavour = None
        env.problem = f"broken: its record {record_file} is unreadable ({type(e).__name__}; run `fbench env create {name}`)"
        return env
    # Read afresh each time, not frozen at creation: a package installed by hand (flash-attn,
    # say) is seen, and the plugins stop refusing what it enables.
    env.versions = installed_versions(path, site_dirs)
    # An optional package the smoke test saw fail to import is not there for the plugins
    # (`env.has` reads metadata only): its scenarios are refused until the env is re-created.
    for module, state in (record.get("smoke_test") or {}).items():
        if module in OPTIONAL_IMPORTS and str(state).startswith("import fails"):
            for dist in [d for d in env.versions if d.lower().replace("-", "_") == module]:
                del env.versions[dist]
    if not env.python.exists():
        env.problem = "broken: its Python is missing"
    elif spec is not None and made_from != _requirements_hash(spec, env.flavour):
        env.problem = "stale: requirements changed since it was made (run `fbench env create %s`)" % name
    elif missing := sdk_missing(env.versions):
        # Every run's worker would die importing the SDK: refused before it starts, saying why.
        env.problem = (f"broken: the worker SDK (framework_bench.worker) cannot import there: No module named "
                       f"{missing[0]!r}, one of its requirements (run `fbench env create {name}`)")
    elif changed := _changed_links(linked):
        env.problem = f"{STALE_PLUGIN} ({changed}; run `fbench env create {name}`)"
    else:
        env.ready = True
    return env


# What the worker SDK (`framework_bench.worker`) imports beyond the standard library, by
# distribution: installed into every env whatever its requirements say (a backend's file need
# not name it), and checked by `inspect` (tests/test_env_freshness.py holds it to the SDK's imports).
SDK_REQUIREMENTS = ("numpy",)
# Every module of the SDK, imported as a worker would; the old names' DeprecationWarnings are not errors.
SDK_IMPORT = """
import importlib, pkgutil, warnings
import framework_bench.worker as sdk
warnings.simplefilter("ignore", DeprecationWarning)
for module in pkgutil.iter_modules(sdk.__path__):
    importlib.import_module(sdk.__name__ + "." + module.name)
"""


def _canonical(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def sdk_missing(versions: dict[str, str]) -> list[str]:
    """The SDK's requirements an env's metadata does not list (milliseconds: no process started)."""
    have = {_canonical(d) for d in versions}
    return [r for r in SDK_REQUIREMENTS if _canonical(r) not in have]


def sdk_import_error(python: Path) -> str | None:
    """None when every module of the worker SDK imports with the env's Python, else the error's
    last line. As a run's worker finds it: through the env's own site-packages and .pth files
    (the host's `framework_bench`, inherited layers); the host's PYTHONPATH is left out, so that
    the env stands on its own."""
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = subprocess.run([str(python), "-c", SDK_IMPORT], capture_output=True, text=True, env=environ)
    if proc.returncode == 0:
        return None
    lines = proc.stderr.strip().splitlines()
    return lines[-1] if lines else f"exited {proc.returncode}"


def installed_versions(path: Path, extra_site_dirs: list[str] = ()) -> dict[str, str]:
    """Distribution name -> version, read from the `*.dist-info/METADATA` files of the env's
    site-packages (then of `extra_site_dirs`, e.g. the system's with --system-site-packages;
    the env's own copy wins, as on its sys.path). Milliseconds, where `pip list` takes seconds."""
    versions: dict[str, str] = {}
    dirs = [*sorted(path.glob("lib/python3*/site-packages")), *map(Path, extra_site_dirs)]
    for site in dirs:
        for metadata in sorted(site.glob("*.dist-info/METADATA")):
            name = version = None
            with metadata.open(encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                    elif line.startswith("Version:"):
                        version = line.split(":", 1)[1].strip()
                    if (name and version) or not line.strip():
                        break
            if name and version:
                versions.setdefault(name, version)
    return versions


def _run(argv: list[str], log, **kw) -> None:
    log.write(f"$ {' '.join(argv)}\n")
    log.flush()
    proc = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, **kw)
    if proc.returncode:
        raise EnvError(f"`{' '.join(argv[:4])} ...` exited {proc.returncode}; see {log.name}")


OPTIONAL_IMPORTS = ("deepspeed", "flash_attn")  # recorded by the smoke test, never required
# Run inside a cuda-flavour env after creation: what every GPU run needs, checked once.
# DeepSpeed and flash-attn are optional (a scenario needing one is refused by its backend):
# recorded as a version, "absent" or "import fails: ...", never required. Importing, not reading
# metadata: an installed package that fails to import must not count as present.
SMOKE_TEST = """
import json, torch
out = {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available()}
if out["cuda_available"]:
    a = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    out["bf16_matmul"] = bool(torch.isfinite(a @ a).all())
    out["gpu"] = torch.cuda.get_device_name(0)
for name in ("deepspeed", "flash_attn"):  # OPTIONAL_IMPORTS
    try:
        out[name] = __import__(name).__version__
    except ModuleNotFoundError as e:
        out[name] = "absent" if e.name == name else "import fails: %s" % e
    except Exception as e:
        out[name] = "import fails: %s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""


def smoke_test(python: Path, gpu_here: bool) -> dict:
    """The cuda flavour's check inside the env: CUDA available and a bf16 matmul on the GPU pass
    it; deepspeed's and flash-attn's state is recorded. Without a GPU here it is not run, and says so."""
    if not gpu_here:
        return {"status": "not run: no GPU here"}
    proc = subprocess.run([str(python), "-c", SMOKE_TEST], capture_output=True, text=True)
    if proc.returncode:
        return {"status": "failed", "error": proc.stderr.strip().splitlines()[-1:]}
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    ok = found["cuda_available"] and found.get("bf16_matmul")
    return {"status": "passed" if ok else "failed", **found}


def _site_dirs(python: Path) -> list[str]:
    """The site-packages folders outside the env that its Python also reads (--system-site-packages)."""
    out = subprocess.run([str(python), "-c", "import json, site, sys; print(json.dumps([p for p in site.getsitepackages()"
                          " if not p.startswith(sys.prefix)]))"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def pip_argv(python: Path, requirements: Path, options: Options, torch_index: str | None) -> list[str]:
    # --no-compile: pip would byte-compile every file of torch, transformers and the framework
    # (most of an env's install time on a small machine); Python compiles what a worker imports.
    argv = [str(python), "-m", "pip", "install", "--no-input", "--disable-pip-version-check", "--no-compile",
            "-r", str(requirements)]
    for folder in options.find_links:
        argv += ["--find-links", folder]
    if options.no_index:
        argv.append("--no-index")
    if options.no_deps:
        argv.append("--no-deps")
    if torch_index:
        argv += ["--extra-index-url", torch_index]
    return argv + options.with_specs + list(SDK_REQUIREMENTS)  # already satisfied: no extra cost


def validate(flavour: str | None, options: Options) -> None:
    """Everything that can be checked before an existing env is touched."""
    if flavour is not None and flavour not in FLAVOURS:
        raise EnvError(f"unknown flavour {flavour!r}: use {' or '.join(FLAVOURS)}")
    for folder in options.find_links:
        if not Path(folder).is_dir():
            raise EnvError(f"--find-links {folder}: no such folder")
    if options.requirements and not Path(options.requirements).is_file():
        raise EnvError(f"--requirements {options.requirements}: no such file")
    if any(not s.strip() for s in options.with_specs):
        raise EnvError("--with needs a requirement spec or a wheel path, not an empty string")


def create(
    name: str,
    spec: EnvSpec,
    flavour: Flavour | None = None,
    say: Callable[[str], None] = lambda msg: None,
    packages: tuple[str, ...] = (),
    options: Options | None = None,
) -> BackendEnv:
    """Create (or reuse) the env of backend `name`; idempotent. `packages` are the plugin's
    top-level import packages its worker needs (besides `framework_bench`).

    The new env is built in a temporary folder beside the old one and swapped in only once
    it is complete: a failed or interrupted creation leaves the old env as it was."""
    options = options or Options()
    validate(flavour, options)
    flavour = flavour or default_flavour()
    current = inspect(name, spec)
    record_file = current.path / RECORD
    old_options = json.loads(record_file.read_text()).get("options", {}) if record_file.exists() else None
    if current.flavour == flavour and old_options == options.model_dump() and (
            current.ready or current.problem.startswith(STALE_PLUGIN)):
        record = json.loads(record_file.read_text())
        record["linked"] = _link_packages(current.python, ("framework_bench", *packages))
        _write_record(current.path, record)
        say(f"{name}: ready at {current.path} (" + ("nothing to do" if current.ready else "plugin copy refreshed") + ")")
        return inspect(name, spec)
    torch_index = options.torch_index
    if flavour == "cuda" and torch_index is None:
        torch_index = torch_index_for(driver_cuda_version())
    requirements = Path(options.requirements) if options.requirements else spec.requirements[flavour]
    path = env_path(name)
    for stale in sweep_building(name):
        say(f"{name}: removed {stale}, left by a creation that was killed")
    building = path.with_name(f".{name}.building-{os.getpid()}")
    if building.exists():
        shutil.rmtree(building)
    building.mkdir(parents=True)
    started = time.monotonic()
    python = _python(building)
    log_path = path.with_name(f"{name}.create.log")
    try:
        with log_path.open("w") as log:
            say(f"{name}: creating venv in {building} (swapped in for {path} when complete)")
            venv = [sys.executable, "-m", "venv", "--prompt", name, str(building)]
            # A venv host's own packages are what "the system's" means here (site_layers says why).
            layered = options.system_site_packages and site_layers.is_venv()
            _run(venv + (["--system-site-packages"] if options.system_site_packages and not layered else []), log)
            inherited = site_layers.inherit(python) if layered else None
            say(f"{name}: pip install -r {requirements.name} (a few minutes)"
                + (f", torch from {torch_index}" if torch_index else ""))
            # pip, not uv: only pip sees the local CPU torch build this machine offers.
            _run(pip_argv(python, requirements, options, torch_index), log)
            linked = _link_packages(python, ("framework_bench", *packages))
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
                _run([str(_python(path)), "-m", module, flavour], log, cwd=path)
            smoke = None
            if flavour == "cuda":
                smoke = smoke_test(_python(path), gpu_here=driver_cuda_version() is not None)
                say(f"{name}: smoke test {smoke['status']}")
                if smoke["status"] == "failed":
                    raise EnvError(f"the cuda env's smoke test failed: {smoke}; see {log_path}")
            # Before "ready": an env whose worker cannot import the SDK would fail every run.
            sdk_error = sdk_import_error(_python(path))
            log.write(f"worker SDK import: {sdk_error or 'ok'}\n")
            if sdk_error:
                raise EnvError(f"the worker SDK (framework_bench.worker) does not import in the {name} env: {sdk_error}; "
                               f"see {log_path}")
        record = {
            "name": name,
            "flavour": flavour,
            "requirements": str(requirements),
            "requirements_sha256": _requirements_hash(spec, flavour),
            "options": options.model_dump(),
            "torch_index": torch_index,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(time.monotonic() - started, 1),
            "host_python": sysconfig.get_python_version(),
            "site_dirs": inherited if layered else _site_dirs(_python(path)) if options.system_site_packages else [],
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


def sweep_building(name: str) -> list[Path]:
    """Clean up after a creation that was killed before it could: remove its half-built env
    (`.NAME.building-PID`, gigabytes for a real one), and where it died between the swap and
    the new env's record (`.NAME.old-PID` beside an env without one), put the old env back.
    A live pid's folders stay."""
    removed = []
    path = env_path(name)
    for folder in sorted(path.parent.glob(f".{name}.building-*")) + sorted(path.parent.glob(f".{name}.old-*")):
        pid = folder.name.rsplit("-", 1)[1]
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
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


def _link_packages(python: Path, packages: tuple[str, ...]) -> dict[str, dict]:
    """Make the host's `framework_bench` and the plugin's own package importable by the
    worker. A package imported from a source folder (an editable install, a checkout) is
    reached through a .pth in the env listing that folder; a .pth *appends* to sys.path, so
    the env's own packages always win. A package installed as files into a site-packages
    (a non-editable `pip install`) is copied into the env instead: listing that site-packages
    would put every host package on the worker's path. Redone on every create, so the env
    follows the checkout or the installed version the host runs. Returns, by package, where it
    comes from and, for a copy, its distribution's version and its files' hash (`_changed_links`)."""
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    roots, linked = [], {}
    for package in packages:
        spec = importlib.util.find_spec(package)
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            raise EnvError(f"cannot find the package {package!r} to make it importable in the env")
        # a package is its folder; a plugin that is one module (`name.py`) is that file
        source = Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations \
            else Path(spec.origin)
        copy = purelib / source.name
        mark = copy / COPY_MARK if spec.submodule_search_locations else purelib / (source.name + COPY_MARK)
        if mark.exists():  # ours, from an earlier create: refreshed below or dropped
            if copy.is_dir():
                shutil.rmtree(copy)  # the mark inside goes with it
            else:
                copy.unlink(missing_ok=True)
                mark.unlink()
        elif copy.exists():
            raise EnvError(f"the env's own {package!r} at {copy} hides the host's: a requirement installs it")
        if _installed_as_files(package, Path(spec.origin) if spec.origin else source / "__init__.py"):
            if source.is_dir():
                shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy2(source, copy)
            mark.write_text(f"copied from {source} by fbench env create\n")
            linked[package] = {"source": str(source), "copied": True, "version": _dist_version(package),
                               "sha256": source_sha256(source)}
        else:
            linked[package] = {"source": str(source), "copied": False}
            if str(source.parent) not in roots:
                roots.append(str(source.parent))
    Path(purelib, PTH_NAME).write_text("".join(r + "\n" for r in roots))
    return linked


def source_sha256(source: Path) -> str:
    """The sha256 of a package's files (names and bytes, byte code left out): what a copy holds."""
    h = hashlib.sha256()
    files = sorted(f for f in source.rglob("*") if f.is_file() and "__pycache__" not in f.parts) \
        if source.is_dir() else [source]
    for f in files:
        h.update(f.relative_to(source.parent).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _dist_version(package: str) -> str | None:
    from importlib.metadata import packages_distributions, version

    names = packages_distributions().get(package) or []
    return version(names[0]) if names else None


def _changed_links(linked: dict[str, dict]) -> str | None:
    """How the host packages an env was made with differ from those the host imports now, or None.
    A package reached through a .pth follows its folder by itself; a copy goes stale silently
    when its distribution is upgraded or reinstalled (its version, or its files' hash), and either
    is wrong once the package comes from elsewhere (an editable install become a wheel, say)."""
    changes = []
    for package, was in linked.items():
        spec = importlib.util.find_spec(package)
        if spec is None or not (spec.submodule_search_locations or spec.origin):
            changes.append(f"{package}: no longer importable by the host")
            continue
        source = Path(next(iter(spec.submodule_search_locations))) if spec.submodule_search_locations \
            else Path(spec.origin)
        if str(source) != was.get("source"):  # an installed package and its checkout are two places
            changes.append(f"{package} now from {source}, was {was.get('source')}")
        elif was.get("copied") and (now := _dist_version(package)) != was.get("version"):
            changes.append(f"{package} version {was.get('version')}→{now}")
        elif was.get("copied") and (now := source_sha256(source)) != was.get("sha256"):
            changes.append(f"{package} source sha256 {str(was.get('sha256'))[:12]}→{now[:12]}")
    return "; ".join(changes) or None


def _write_record(path: Path, record: dict) -> None:
    """Replace the env's record at once: a concurrent `inspect` never reads half of it."""
    tmp = path / f"{RECORD}.{os.getpid()}"
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path / RECORD)


def _installed_as_files(package: str, origin: Path) -> bool:
    """Whether `package`, imported from `origin` (its `__init__.py`, or the module file of a
    one-module plugin), is a distribution's installed files (an installer's RECORD lists them
    there) rather than a source folder: an editable install's RECORD lists only its path hook,
    and a checkout's egg-info has no RECORD."""
    from importlib.metadata import distributions, packages_distributions

    names = set(packages_distributions().get(package, []))
    for dist in (d for name in names for d in distributions(name=name)):
        if dist.read_text("RECORD") is None:
            continue
        if any(f.parts[:1] in ((package,), (f"{package}.py",)) and Path(dist.locate_file(f)).resolve() == origin.resolve()
               for f in dist.files or []):
            return True
    return False
