"""``scripts/torch_dist_files.py``: runs test files with the switch off and on, and reports.

PyTorch's own files are not here (nor on CI); a tiny tree of our own stands in for a
checkout: one test that passes both ways, one that passes only with the switch off, one
that skips, and one whose set-up fails where ``MultiThreadedTestCase`` does not report it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "torch_dist_files.py"

_FILE = textwrap.dedent(
    """
    import os
    import unittest

    import torch
    import torch.distributed as dist
    from torch.testing._internal.common_distributed import MultiThreadedTestCase
    from torch.testing._internal.common_utils import run_tests


    class Plain(unittest.TestCase):
        def test_both_ways(self):
            self.assertEqual(torch.ones(2).sum().item(), 2.0)

        def test_only_without_the_switch(self):
            self.assertNotEqual(os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS"), "1")

        def test_skips(self):
            self.skipTest("not here")

        def test_fails_in_torchs_switch_path(self):
            if os.environ.get("TORCH_DISTRIBUTED_USE_TORCHCOMMS") == "1":
                raise NotImplementedError(
                    "new_group cannot delegate to split_group with "
                    "use_local_synchronization=True"
                )


    class Threads(MultiThreadedTestCase):
        @property
        def world_size(self):
            return 2

        def setUp(self):
            super().setUp()
            self._spawn_threads()

        def perThreadSetUp(self):
            # Raised outside the try that reports a rank's errors, as an
            # init_process_group error is.
            raise RuntimeError("per-thread set-up failed")

        def test_never_runs(self):
            dist.all_reduce(torch.ones(1))


    if __name__ == "__main__":
        run_tests()
    """
)


def _tree(tmp_path: Path) -> Path:
    folder = tmp_path / "pytorch" / "test" / "distributed"
    folder.mkdir(parents=True)
    (folder / "test_tiny.py").write_text(_FILE)
    return tmp_path / "pytorch"


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env if env is not None else dict(os.environ),
    )


def test_without_a_pytorch_checkout_it_skips_and_says_why() -> None:
    env = dict(os.environ)
    env.pop("TORCHCOMMS_PYTORCH_TESTS", None)
    done = _run(env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("skipped: no PyTorch checkout given")
    assert "TORCHCOMMS_PYTORCH_TESTS" in done.stdout
    done = _run("--pytorch", "/nonexistent/pytorch", env=env)
    assert done.returncode == 0 and "holds no test/distributed folder" in done.stdout


def test_counts_both_ways_names_regressions_and_surfaces_swallowed_errors(tmp_path) -> None:
    tree = _tree(tmp_path)
    done = _run("--pytorch", str(tree), "--files", "test/distributed/test_tiny.py")
    out = done.stdout
    # Off: three pass, one skips, the threads test fails (its set-up error surfaced).
    assert "test/distributed/test_tiny.py switch off: 3 passed, 1 failed, 1 skipped" in out, out
    assert "test/distributed/test_tiny.py switch on: 1 passed, 3 failed, 1 skipped" in out, out
    # PyTorch's own failure is named as such, not counted as the bridge's regression.
    assert "1 test(s) pass with the switch off and fail with it on inside PyTorch's" in out
    assert "Plain::test_fails_in_torchs_switch_path: PyTorch's switch refuses new_group" in out
    assert "1 test(s) pass with the switch off and not with it on" in out
    assert "test_tiny.py::Plain::test_only_without_the_switch: FAILED" in out
    assert done.returncode == 1  # a regression fails the run
    assert "| test/distributed/test_tiny.py | on | 1 | 3 | 1 |" in out


def test_the_swallowed_error_would_pass_without_the_hooks(tmp_path) -> None:
    """The control: run plainly, PyTorch's framework lets the broken test pass."""
    tree = _tree(tmp_path)
    folder = tree / "test" / "distributed"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_tiny.py",
            "-k",
            "Threads",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "1 passed" in done.stdout, done.stdout + done.stderr


_CLEAN_FILE = textwrap.dedent(
    """
    import os
    import unittest

    from torch.testing._internal.common_utils import run_tests


    class Installed(unittest.TestCase):
        def test_same_everywhere(self):
            self.assertTrue(True)

        def test_changed_by_being_installed(self):
            # Stands in for a test our distributions change merely by being installed.
            self.assertEqual(os.environ.get("STAND_IN_CLEAN"), "1")


    if __name__ == "__main__":
        run_tests()
    """
)


def test_a_clean_environment_is_the_baseline_of_the_switch_off_run(tmp_path) -> None:
    folder = tmp_path / "pytorch" / "test" / "distributed"
    folder.mkdir(parents=True)
    (folder / "test_installed.py").write_text(_CLEAN_FILE)
    # The clean interpreter: this one, marked, standing in for an environment without us.
    clean = tmp_path / "clean-python"
    clean.write_text(f'#!/bin/sh\nSTAND_IN_CLEAN=1 exec {sys.executable} "$@"\n')
    clean.chmod(0o755)
    done = _run(
        "--pytorch",
        str(tmp_path / "pytorch"),
        "--files",
        "test/distributed/test_installed.py",
        "--switch",
        "off",
        "--clean-python",
        str(clean),
    )
    out = done.stdout
    assert "test_installed.py clean (torch alone): 2 passed, 0 failed, 0 skipped" in out, out
    assert "1 test(s) pass with torch alone and not with torchcomms installed" in out, out
    assert "test_installed.py::Installed::test_changed_by_being_installed: FAILED" in out
    assert done.returncode == 1
