"""No package of src/ uses another package's ``_`` names (scripts/private_reaches.py)."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "scripts", "private_reaches.py")


def _run(root: str, *paths: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, SCRIPT, "--root", root, *paths],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _write(root: str, rel: str, text: str) -> None:
    path = os.path.join(root, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_src_reaches_into_no_other_package() -> None:
    res = _run(ROOT, "src")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip().endswith("0 private reaches in src"), res.stdout


def test_every_kind_of_reach_is_caught(tmp_path: object) -> None:
    # The check can fail: an import of another package's private name, of a private
    # module, a private attribute read through another package's module, and a
    # communicator's private member read outside comm/ (directly, by getattr, or a
    # member some other class shares, through an object named as a communicator).
    root = str(tmp_path)
    core = "src/torchcomms_core"
    _write(root, f"{core}/__init__.py", "")
    _write(root, f"{core}/comm/__init__.py", "")
    _write(
        root,
        f"{core}/comm/base.py",
        "class CommBase:\n"
        "    def __init__(self):\n"
        "        self._state = 0\n"
        "        self._lock = None\n"
        "    def _fail(self): ...\n",
    )
    _write(root, f"{core}/hooks/__init__.py", "")
    _write(root, f"{core}/hooks/_args.py", "X = 1\n")
    _write(root, f"{core}/hooks/ring.py", "_Track = 1\nTrack = 2\nfrom . import _args\n")
    _write(root, f"{core}/c10d/__init__.py", "")
    _write(
        root,
        f"{core}/c10d/lane.py",
        "from torchcomms_core.hooks.ring import _Track, Track\n"
        "from torchcomms_core.hooks import _args\n"
        "from torchcomms_core.hooks import ring\n"
        "import torchcomms_core.hooks.ring as r\n"
        "A = ring._Track\n"
        "B = r.__name__\n",
    )
    _write(
        root,
        f"{core}/foundation/__init__.py",
        "",
    )
    _write(
        root,
        f"{core}/foundation/work.py",
        "class Work:\n"
        "    def __init__(self, comm):\n"
        "        self._lock = None\n"
        "        self._comm = comm\n"
        "    def f(self, comm, other):\n"
        "        comm._fail()\n"
        "        getattr(comm, '_state', None)\n"
        "        other._lock\n"
        "        comm._lock\n"
        "        self._lock\n"
        "        other._state = 1\n",
    )
    res = _run(root, "src")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    lane = os.path.join("src", "torchcomms_core", "c10d", "lane.py")
    work = os.path.join("src", "torchcomms_core", "foundation", "work.py")
    assert lines == [
        f"{lane}:1: from torchcomms_core.hooks.ring import _Track",
        f"{lane}:2: from torchcomms_core.hooks import _args",
        f"{lane}:5: torchcomms_core.hooks.ring._Track",
        f"{work}:6: comm._fail (communicator attribute)",
        f"{work}:7: getattr(comm, '_state', None) (communicator attribute)",
        f"{work}:9: comm._lock (communicator attribute)",
        "6 private reaches in src",
    ]


def test_a_missing_path_is_refused_with_what_to_give() -> None:
    res = _run(ROOT, "no_such_folder")
    assert res.returncode == 2
    assert "no such path" in res.stderr and "relative to --root" in res.stderr
