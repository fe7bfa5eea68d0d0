"""No module of the core or of a plugin imports itself back through others."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "import_circles.py")


def _run(root: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, root], capture_output=True, text=True, timeout=120
    )


def test_the_tree_has_no_import_circle() -> None:
    res = _run(ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 import circles" in res.stdout


def _write(root: str, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_a_circle_hidden_in_a_function_or_type_check_is_caught(tmp_path: object) -> None:
    # The check can fail: a plugin whose backend imports its window at module level while
    # the window imports the backend only under TYPE_CHECKING, and a core pair that meets
    # through a relative import inside a function; a package re-exporting its own
    # submodule is not a circle.
    root = str(tmp_path)
    pkg = "plugins/torchcomms_x/src/torchcomms_x"
    _write(root, f"{pkg}/__init__.py", "from torchcomms_x.backend import Backend\n")
    _write(root, f"{pkg}/backend.py", "from torchcomms_x import window\nclass Backend: ...\n")
    _write(
        root,
        f"{pkg}/window.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from torchcomms_x.backend import Backend\n",
    )
    _write(root, "src/core/__init__.py", "")
    _write(root, "src/core/a.py", "def f():\n    from .b import g\n")
    _write(root, "src/core/b.py", "from core import a\ndef g(): ...\n")
    res = _run(root)
    assert res.returncode == 1
    assert "torchcomms_x.backend <-> torchcomms_x.window" in res.stdout
    assert "core.a <-> core.b" in res.stdout
    assert "2 import circles" in res.stdout
