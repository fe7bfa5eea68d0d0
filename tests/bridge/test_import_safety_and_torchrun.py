"""Fresh interpreters and real launchers: import safety, torchrun quickstart.

These start new Python processes (seconds each), so they are few and small.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _run(args: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for var in (
        "TORCHCOMM_RANK",
        "TORCHCOMM_SIZE",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
    ):
        env.pop(var, None)
    env.update(kwargs.pop("env", {}))
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, **kwargs
    )


def test_import_torch_distributed_then_torchcomms_in_a_fresh_interpreter() -> None:
    code = textwrap.dedent("""
        import sys
        import torch.distributed as dist
        import torchcomms
        assert dist.is_available()
        assert not [m for m in sys.modules if m.startswith("torchcomms_gloo")], "plugin loaded"
        print("ok", torchcomms.__version__)
    """)
    res = _run([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("ok")


def test_import_torchcomms_first_then_torch_distributed() -> None:
    code = "import torchcomms, torch.distributed as dist; print(dist.is_initialized())"
    res = _run([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"


def test_import_torchcomms_does_not_touch_torch_distributed_attributes() -> None:
    # torch.distributed imports a package named torchcomms while half-initialised; make
    # sure our top-level import neither needs nor triggers torch.distributed.
    code = textwrap.dedent("""
        import sys
        import torch
        sys.modules.pop("torch.distributed", None)
        import torchcomms
        print("torch.distributed" in sys.modules)
    """)
    res = _run([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr


PLAIN_SCRIPT = textwrap.dedent("""
    import sys
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    sys.stdout.write(f"sum {t[0].item()}\\n")
    dist.destroy_process_group()
""")


@pytest.mark.slow
def test_torchrun_of_a_plain_torch_distributed_script_still_works(tmp_path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    res = _run([*TORCHRUN, "--standalone", "--nproc-per-node", "2", str(script)])
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("sum 3.0") == 2


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_quickstart_under_torchrun(nproc: int) -> None:
    res = _run(
        [*TORCHRUN, "--standalone", "--nproc-per-node", str(nproc), "examples/quickstart.py"]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    expected = nproc * nproc * (nproc - 1) / 2
    for r in range(nproc):
        assert f"I am rank {r} of {nproc}!" in res.stdout
    assert res.stdout.count(f"every element is {expected:g} (expected {expected:g})") == nproc


@pytest.mark.slow
def test_quickstart_under_mpi_style_environment() -> None:
    # OpenMPI-style variables (no torchrun): rank 0 hosts the store.
    procs = []
    port = "29531"
    for r in range(2):
        env = {
            "OMPI_COMM_WORLD_RANK": str(r),
            "OMPI_COMM_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        full = {**os.environ, "OMP_NUM_THREADS": "1", **env}
        for var in (
            "TORCHCOMM_RANK",
            "TORCHCOMM_SIZE",
            "RANK",
            "WORLD_SIZE",
            "TORCHELASTIC_USE_AGENT_STORE",
        ):
            full.pop(var, None)
        procs.append(
            subprocess.Popen(
                [sys.executable, "examples/quickstart.py"],
                cwd=ROOT,
                env=full,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert "every element is 2 (expected 2)" in out
