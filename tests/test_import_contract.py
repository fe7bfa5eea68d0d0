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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
        "exclude_type_checking_imports = True",
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
    assert "BROKEN" in res.stdout and "torchcomms_core.comm.operations" in res.stdout
