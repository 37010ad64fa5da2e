"""A backend at a version: `trl@transformers==5.23.0`, `llamafactory@0.9.4`, `trl@1.15.0@peft==0.17.1`.

The name before the first `@` is an installed backend; each `@` after it pins one distribution of
its env: a bare version pins the framework's own package (`EnvSpec.framework_package`), `DIST==V`
any other. The pinned backend is the plugin unchanged, under the spec's canonical name and with
an env of its own, made from the plugin's requirements with the pins in place of its lines
(`requirements`), layered over the plugin's env (`framework_bench/envs/creation.py`). A pin
outside the release range the plugin declares (`EnvSpec.supports`) is `refusal`'s, before any
env is made.
"""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from framework_bench.plugins.contract import EnvSpec
from framework_bench.scenario import places

SEP = "@"


class BadSpec(ValueError):
    pass


def plugin_name(spec: str) -> str:
    """The plugin a spec names: `trl` of `trl@transformers==5.23.0`, any other name as given."""
    return spec.split(SEP)[0]


def split(spec: str, framework_package: str) -> tuple[str, dict[str, str]]:
    """(the backend's name, {distribution: version}) of `spec`, a bare version pinning
    `framework_package`; a malformed pin, or a distribution pinned twice, raises `BadSpec` saying which."""
    base, *parts = spec.split(SEP)
    own = canonicalize_name(framework_package)
    pins: dict[str, str] = {}
    for part in parts:
        dist, version = (own, part) if "=" not in part and "<" not in part and ">" not in part else _pin(part, spec)
        try:
            Version(version)
        except InvalidVersion:
            raise BadSpec(f"{spec!r}: {part!r} is not a release (`NAME@1.2.3` or `NAME@DIST==1.2.3`)") from None
        if dist in pins:
            raise BadSpec(f"{spec!r}: {dist} is pinned twice")
        pins[dist] = version
    if not base or (parts and not pins):
        raise BadSpec(f"{spec!r}: give a backend name, then `@VERSION` or `@DIST==VERSION` per pin")
    return base, pins


def _pin(part: str, spec: str) -> tuple[str, str]:
    try:
        req = Requirement(part)
    except InvalidRequirement:
        req = None
    exact = req and len(req.specifier) == 1 and next(iter(req.specifier)).operator == "=="
    if not exact or req.extras or req.marker or req.url:
        raise BadSpec(f"{spec!r}: {part!r} is no exact pin; a version env pins releases (`DIST==1.2.3`)")
    return canonicalize_name(req.name), next(iter(req.specifier)).version


def canonical(spec: str, framework_package: str) -> str:
    """`spec` as it is stored and its env named: the framework's version first, bare, then the
    other pins by distribution."""
    base, pins = split(spec, framework_package)
    own = pins.pop(canonicalize_name(framework_package), None)
    return SEP.join([base, *([own] if own else []), *(f"{d}=={v}" for d, v in sorted(pins.items()))])


def refusal(spec: str, env: EnvSpec) -> str | None:
    """Why the plugin cannot run at `spec`'s pins: one outside the releases it declares."""
    from packaging.specifiers import SpecifierSet

    supports = {canonicalize_name(d): r for d, r in env.supports.items()}
    for dist, version in split(spec, env.framework_package)[1].items():
        if dist in supports and Version(version) not in SpecifierSet(supports[dist]):
            return (f"{spec}: its plugin supports {dist} {supports[dist]}, not {version} "
                    "(EnvSpec.supports: the releases its binding was written for)")
    return None


def requirements(spec: str, env: EnvSpec) -> EnvSpec:
    """The env of `spec`: the plugin's requirements per flavour with each pinned distribution's
    line replaced by its pin (added where it had none), written under the state folder."""
    pins = split(spec, env.framework_package)[1]
    folder = places.state_dir() / "envs" / ".pins"
    files: dict = {}
    for flavour, path in env.requirements.items():
        kept, lines = set(), []
        for line in Path(path).read_text().splitlines():
            name = _requirement_name(line)
            if name in pins:
                kept.add(name)
                line = f"{name}=={pins[name]}  # {spec}"
            lines.append(line)
        lines += [f"{d}=={v}  # {spec}" for d, v in pins.items() if d not in kept]
        text = "\n".join(lines) + "\n"
        files[flavour] = folder / f"{spec}.requirements-{flavour}.txt"
        if not files[flavour].exists() or files[flavour].read_text() != text:
            folder.mkdir(parents=True, exist_ok=True)
            files[flavour].write_text(text)
    return env.model_copy(update={"requirements": files})


def _requirement_name(line: str) -> str | None:
    text = line.split("#", 1)[0].strip()
    if not text or text.startswith("-"):
        return None
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return None
