"""The host knows no backend by name: what differs between frameworks comes from
each backend's `BackendInfo`, so a third backend gets its memory scheme, manifest and report
notes the same way. Docstrings and comments may name the frameworks (they say why); code may not."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "framework_bench"

# Names that would only be written to single out a bundled backend or its framework.
FRAMEWORK = re.compile(r"xtuner|llama[-_]?factory|mmengine|\btrl\b|ms[-_]?swift", re.IGNORECASE)
# "torch" is also the package every env holds: only its use as a backend name is caught.
TORCH = "torch"
# Attributions, not branches: the published table's figures and TFLOPs formula are XTuner's
# (`show --json` names the formula's keys after it); the Alpaca demo files come from
# LLaMA-Factory's repository (scenario/catalog.py: their download address).
ATTRIBUTION = re.compile(r"XTuner('s)? (published )?formula|published XTuner|XTuner / model|xtuner_(per_token|tflops)"
                         r"|hiyouga/LLaMA-Factory/main/data/|LLaMA-Factory's demo files")


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def _as_backend_name(node: ast.Constant, parents: dict[int, ast.AST]) -> bool:
    """Whether a "torch" literal stands where a backend name would: compared, a dict key, or a
    constant's whole value; not a package name handed to a call or listed among packages."""
    parent = parents.get(id(node))
    if isinstance(parent, ast.Compare):
        return True
    if isinstance(parent, ast.Dict):
        return any(k is node for k in parent.keys)
    return isinstance(parent, (ast.Assign, ast.AnnAssign))


def offences(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    docs = _docstrings(tree)
    parents = {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if FRAMEWORK.search(ATTRIBUTION.sub("", node.value)):
                name = node.value
            elif node.value == TORCH and _as_backend_name(node, parents):
                name = node.value
        elif isinstance(node, ast.Name) and FRAMEWORK.search(node.id):
            name = node.id
        if name is not None:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {name[:80]!r}")
    return found


def test_the_host_names_no_bundled_backend():
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) for hit in offences(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_backend_name(tmp_path):
    """The check itself: a branch on a name, a name table and a reference constant are caught."""
    module = tmp_path / "m.py"
    module.write_text('"""XTuner may be named here."""\n'
                      'def f(b):\n    return b == "xtuner"\n'
                      'NAMES = {"llamafactory": "LLaMA-Factory"}\n'
                      'REFERENCE = "torch"\n'
                      'v = version("torch")\n'
                      'label = "TFLOPs / GPU (XTuner formula)"\n')
    hits = offences(module, tmp_path)
    assert sorted(h.split(":")[1] for h in hits) == ["3", "4", "4", "5"]


def test_an_engines_settings_keys_come_from_the_backends_that_use_it():
    """DeepSpeed's ZeRO bucket keys move a step's time, but only a DeepSpeed run records them:
    the host's common keys hold none of them; they count because the backends declare them."""
    from framework_bench.plugins import registry
    from framework_bench.plugins.deepspeed_settings import DEEPSPEED_SPEED_SETTINGS
    from framework_bench.present.differences import COMMON_SPEED_SETTINGS, speed_relevant

    assert COMMON_SPEED_SETTINGS.isdisjoint(DEEPSPEED_SPEED_SETTINGS)
    declaring = {name for name, b in registry.backends().items() if b.info.speed_settings}
    assert declaring == {"xtuner", "llamafactory", "trl", "swift"}
    assert set(DEEPSPEED_SPEED_SETTINGS) <= speed_relevant()
