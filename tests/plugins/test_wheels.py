"""Wheels, installed the way users get them: built with hatchling, in a fresh environment.

The fresh environment sees this environment's site-packages (for torch and pytest) but
none of its source trees; everything torchcomms comes from the wheels.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from importlib import metadata
from pathlib import Path

import pytest

from torchcomms_core.testing import run_conformance

ROOT = Path(__file__).resolve().parents[2]
PROJECTS = ["", "plugins/torchcomms_gloo", "plugins/torchcomms_quantized", "examples/vendor_plugin"]


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_"))
        and k not in ("RANK", "WORLD_SIZE", "PYTHONPATH")
    }
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, **kwargs)


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        metadata.version("torchcomms-examplevendor")
    except metadata.PackageNotFoundError:
        pass
    else:
        pytest.skip(
            "torchcomms-examplevendor is installed in the test environment; the "
            "uninstall check needs it absent: pip uninstall torchcomms-examplevendor"
        )
    tmp = tmp_path_factory.mktemp("wheels")
    wheels = tmp / "dist"
    res = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheels),
            *[str(ROOT / p) for p in PROJECTS],
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    built = sorted(p.name for p in wheels.glob("*.whl"))
    assert [b.split("-")[0] for b in built] == [
        "torchcomms_core",
        "torchcomms_examplevendor",
        "torchcomms_gloo",
        "torchcomms_quantized",
    ]
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    child = env_dir / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    child_site = _run([str(child), "-c", code]).stdout.strip()
    # A plain path line (no .pth processing of the parent): torch and pytest become visible,
    # this checkout's editable installs do not.
    Path(child_site, "_parent_site.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    res = _run(
        [
            str(child),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            *[str(w) for w in wheels.glob("*.whl")],
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return env_dir


@pytest.mark.slow
def test_vendor_backend_resolves_by_entry_point_from_its_wheel(fresh_env: Path) -> None:
    code = (
        "import torchcomms, torchcomms_core; "
        "cls = torchcomms.get_backend_class('examplevendor'); "
        "print(cls.__module__, torchcomms_core.__file__)"
    )
    res = _run([str(fresh_env / "bin" / "python"), "-c", code], cwd="/")
    assert res.returncode == 0, res.stderr
    module, core_file = res.stdout.split()
    assert module == "torchcomms_examplevendor.backend"
    assert str(fresh_env) in core_file and str(ROOT / "src") not in core_file


@pytest.mark.slow
def test_cli_of_the_wheel_lists_the_vendor_backend(fresh_env: Path) -> None:
    res = _run([str(fresh_env / "bin" / "torchcomms"), "backends"], cwd="/")
    assert res.returncode == 0, res.stderr
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith("examplevendor"))
    assert "torchcomms-examplevendor" in line and "yes" in line
    res = _run([str(fresh_env / "bin" / "torchcomms"), "plugins"], cwd="/")
    assert "quantized_all_reduce" in res.stdout


@pytest.mark.slow
def test_conformance_suite_passes_on_the_installed_vendor_backend(fresh_env: Path) -> None:
    # The wheel's suite, in the fresh environment, with nothing of this checkout on its path.
    res = run_conformance(
        "examplevendor",
        2,
        python=fresh_env / "bin" / "python",
        env={"PYTHONPATH": None, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "passed" in res.stdout and "failed" not in res.stdout
    assert "native vs derived" in res.stdout


def _names_test_module():
    """tests/bridge/test_c10d_backend_names.py: its launcher and the gloo comparison."""
    import importlib.util

    path = ROOT / "tests" / "bridge" / "test_c10d_backend_names.py"
    spec = importlib.util.spec_from_file_location("c10d_backend_names_for_wheels", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
# The vendor backend moves every byte through store round trips: 4 ranks once, switch off.
@pytest.mark.parametrize(
    ("switch", "world"), [(False, 2), (True, 2), (False, 4)], ids=["plain-2", "switch-2", "plain-4"]
)
def test_vendor_backend_from_its_wheel_is_a_torch_distributed_name(
    fresh_env: Path, switch: bool, world: int
) -> None:
    # The unchanged script imports nothing of torchcomms: "examplevendor" is a c10d name
    # because the core's wheel registered every installed backend at `import torch`.
    names = _names_test_module()
    python = str(fresh_env / "bin" / "python")
    runs = names.launch([str(names.SCRIPT), "examplevendor"], world, switch=switch, python=python)
    got = names.results(runs)
    names.check_against_gloo(got, world, "examplevendor")


@pytest.mark.slow
def test_uninstalled_vendor_backend_gives_a_clear_error(fresh_env: Path) -> None:
    python = str(fresh_env / "bin" / "python")
    res = _run([python, "-m", "pip", "uninstall", "-q", "-y", "torchcomms-examplevendor"])
    assert res.returncode == 0, res.stderr
    code = (
        "import torchcomms\n"
        "try:\n"
        "    torchcomms.new_comm('examplevendor', 'cpu')\n"
        "except torchcomms.BackendNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    res = _run([python, "-c", code], cwd="/")
    assert "no torchcomms backend named 'examplevendor' is installed" in res.stdout
    assert "pip install torchcomms-examplevendor" in res.stdout
