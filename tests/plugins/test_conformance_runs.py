"""Our own backends pass the shipped conformance suite, run exactly as a vendor runs it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchcomms_core.testing import conformance_env, run_conformance
from torchcomms_core.testing.runner import conformance_command


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_gloo_passes_the_conformance_suite(world_size: int) -> None:
    res = run_conformance("gloo", world_size)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]
    assert "failed" not in res.stdout and "skipped" not in res.stdout
    assert f"{world_size} ranks" in res.stdout
    assert "derived: all_gather_v, reduce_scatter_v, split" in res.stdout


@pytest.mark.parametrize("world_size", [2, 4])
def test_shm_passes_the_conformance_suite(world_size: int) -> None:
    res = run_conformance("shm", world_size)
    assert res.returncode == 0, res.stdout[-5000:] + res.stderr[-2000:]
    assert "failed" not in res.stdout and "skipped" not in res.stdout
    assert f"{world_size} ranks" in res.stdout
    assert "derived: gather, gather_single, reduce, scatter, split" in res.stdout


def test_conformance_suite_is_inert_without_a_backend() -> None:
    res = run_conformance(None, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:]
    assert "skipped" in res.stdout and "passed" not in res.stdout


def _module_run(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_", "PYTEST_"))
    }
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**clean, **env},
        cwd="/",
    )


def test_the_module_entry_runs_the_suite_even_without_plugin_autoloading() -> None:
    # Plain pytest would answer "unrecognized arguments: --torchcomms-backend" here.
    res = _module_run(
        "import sys\n"
        "from torchcomms_core.testing.__main__ import main\n"
        "sys.exit(main(['-q', '-p', 'no:cacheprovider', '--torchcomms-backend', 'gloo', "
        "'-k', 'resolves']))",
        PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 passed" in res.stdout and "native vs derived" in res.stdout
    assert "warning" not in res.stdout


def test_the_module_entry_without_pytest_names_the_extra() -> None:
    res = _module_run(
        "import sys\n"
        "sys.modules['pytest'] = None  # as if pytest were not installed\n"
        "from torchcomms_core.testing.__main__ import main\n"
        "sys.exit(main(['--torchcomms-backend', 'gloo']))"
    )
    assert res.returncode == 2, res.stderr
    assert "pytest is not installed" in res.stderr
    assert 'pip install "torchcomms-core[conformance]"' in res.stderr


def test_the_runner_leaves_launcher_variables_out_of_the_run() -> None:
    base = {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "MASTER_ADDR": "h",
        "TORCHCOMM_TIMEOUT_SECONDS": "5",
        "PMI_RANK": "3",
        "HOME": "/home/x",
        "DROP": "me",
        "PYTHONPATH": "/old",
    }
    env = conformance_env({"DROP": None, "EXTRA": "1"}, pythonpath=["/new"], base=base)
    assert env == {"HOME": "/home/x", "EXTRA": "1", "PYTHONPATH": os.pathsep.join(["/new", "/old"])}
    assert conformance_command("mpi", 4, ["-x"], python="py")[:3] == ["py", "-m", "pytest"]
    assert conformance_command(None, quiet=False)[-2:] == ["--pyargs", "torchcomms_core.testing"]
