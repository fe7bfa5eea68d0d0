"""The import layers of pyproject.toml's [tool.importlinter] hold (run by `lint-imports`).

The contracts: the core never imports the face or a plugin, no plugin imports another,
engines build on the spec, and the core's layers (tools, bridges, creation, communicator,
plugins, spec) only import downwards, so no import cycle can come back.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lint_imports() -> list[str]:
    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("import-linter is not installed (it is in the [test] extra)")
    return [exe, "--no-cache"]


def test_every_import_contract_is_kept() -> None:
    res = subprocess.run(_lint_imports(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout
    assert "kept" in res.stdout


def test_a_cycle_into_a_lower_layer_is_caught(tmp_path: object) -> None:
    # The contract can fail: a copy of the config whose spec layer sits above the
    # communicator breaks, because the communicator imports the spec.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        config = tomllib.load(f)["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")
    flipped = ["spec", *[x for x in layers["layers"] if x != "spec"]]
    lines = [
        "[importlinter]",
        "root_packages =",
        *[f"    {p}" for p in config["root_packages"]],
        "exclude_type_checking_imports = False",
        "",
        "[importlinter:contract:flipped]",
        "name = flipped",
        "type = layers",
        "containers = torchcomms_core",
        "layers =",
        *[f"    {x}" for x in flipped],
    ]
    path = os.path.join(str(tmp_path), "flipped.ini")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    res = subprocess.run(
        [*_lint_imports(), "--config", path], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert res.returncode != 0
    assert "BROKEN" in res.stdout and "not allowed to import torchcomms_core.spec" in res.stdout


# -- the communicator's private members stay in its package ----------------------------

_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
_COMM = _ROOT / "src" / "torchcomms_core" / "comm"
# Receivers that are not communicators but have members of the same names (a work's own
# lock, a backend's ``_bind``, c10d options' ``_timeout``, a test engine's ``_store``, a
# window's ``_device``).
_NOT_A_COMM = {
    "work",
    "child",
    "instance",
    "opts",
    "backend",
    "b",
    "sopts",
    "self._backend",
    "win",
}


def _private_members() -> set[str]:
    """Every ``_`` member CommBase and TorchComm define or assign on ``self``."""
    import ast

    names: set[str] = set()
    for path in (_COMM / "base.py", _COMM / "operations.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in ("CommBase", "TorchComm"):
                for sub in ast.walk(node):
                    if (
                        isinstance(sub, ast.Attribute)
                        and isinstance(sub.value, ast.Name)
                        and sub.value.id == "self"
                    ):
                        names.add(sub.attr)
                    elif isinstance(sub, ast.FunctionDef):
                        names.add(sub.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _protocol_members() -> set[str]:
    """The ``_`` members the ``Communicator`` protocol declares (none: lower layers use only
    a communicator's public members)."""
    import ast

    path = _ROOT / "src" / "torchcomms_core" / "foundation" / "protocols.py"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.name == "Communicator":
            names |= {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _uses(paths: list[object], members: set[str]) -> list[str]:
    import ast

    found = []
    for path in paths:
        tree = ast.parse(path.read_text())  # type: ignore[attr-defined]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in members:
                receiver = ast.unparse(node.value)
                if (
                    receiver not in ("self", "cls")
                    and receiver not in _NOT_A_COMM
                    and not receiver.endswith((".options", ".opts"))
                ):
                    found.append(f"{path}:{node.lineno}: {receiver}.{node.attr}")
    return found


def test_no_private_communicator_member_is_used_outside_its_package() -> None:
    members = _private_members()
    assert {"_state", "_lock", "_backend", "_issue", "_guard", "_relean"} <= members
    code = [
        *(_ROOT / "src").rglob("*.py"),
        *(_ROOT / "plugins").glob("*/src/**/*.py"),
        *(_ROOT / "plugins").glob("*/tests/**/*.py"),
        *(_ROOT / "tests").rglob("*.py"),
        *(_ROOT / "benchmarks").rglob("*.py"),
        *(_ROOT / "examples").rglob("*.py"),
        *(_ROOT / "scripts").rglob("*.py"),
    ]
    outside = [p for p in code if _COMM not in p.parents]
    # The protocol of what lower layers need declares public members only: a work tells
    # its communicator of a failure through ``on_work_failure``.
    assert _protocol_members() == set()
    assert _uses(outside, members) == []
    work = _ROOT / "src" / "torchcomms_core" / "foundation" / "work.py"
    assert '"on_work_failure"' in work.read_text()


def test_the_package_uses_only_the_state_modules_interface() -> None:
    import torchcomms_core.comm.base as base

    members = _private_members() - set(base.CommBase.INTERFACE)
    # The communicator's own operations: TorchComm (operations.py), the methods written from
    # the operation table (face.py) and their forms (forms.py), which took them over.
    own = ("base.py", "operations.py", "face.py", "forms.py")
    siblings = [p for p in _COMM.glob("*.py") if p.name not in own]
    assert _uses(siblings, members) == []


def test_the_check_sees_a_private_member_read_from_outside(tmp_path: object) -> None:
    import pathlib

    bad = pathlib.Path(str(tmp_path)) / "reach_in.py"
    bad.write_text("def f(comm):\n    return comm._state\n")
    assert _uses([bad], _private_members()) == [f"{bad}:2: comm._state"]


def test_plugins_import_the_core_only_through_the_plugin_namespace() -> None:
    import ast

    wrong = []
    for path in (_ROOT / "plugins").glob("*/src/**/*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torchcomms"):
                if node.module != "torchcomms_core.plugin" and node.level == 0:
                    wrong.append(f"{path}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                wrong += [
                    f"{path}:{node.lineno}: import {a.name}"
                    for a in node.names
                    if a.name.startswith("torchcomms")
                ]
    assert wrong == []


def test_the_plugin_namespace_loads_no_pytorch_bridge() -> None:
    code = (
        "import sys, torchcomms_core.plugin\n"
        "print(sorted(m for m in sys.modules if m.startswith(('torchcomms_core.pytorch',"
        " 'torchcomms_core.functional', 'torchcomms_core.bench', 'torchcomms.'))))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
    plugin = __import__("torchcomms_core.plugin", fromlist=["__all__"])
    missing = [name for name in plugin.__all__ if not hasattr(plugin, name)]
    assert missing == []
