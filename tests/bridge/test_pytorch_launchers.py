"""PyTorch's own entry points into torchcomms, in fresh interpreters and under torchrun.

torch.distributed must find our package at import; the examples must train to the
reference; an unchanged script must give the same results with the switch on and off.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
SWITCH = "TORCH_DISTRIBUTED_USE_TORCHCOMMS"


def _run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess:
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    for var in (
        "TORCHCOMM_RANK",
        "TORCHCOMM_SIZE",
        "RANK",
        "WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCHELASTIC_USE_AGENT_STORE",
        SWITCH,
    ):
        full.pop(var, None)
    full.update(env or {})
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=full, cwd=ROOT)


def test_torch_distributed_sees_torchcomms_in_a_fresh_interpreter() -> None:
    code = textwrap.dedent("""
        import torch.distributed.distributed_c10d as c10d
        import torchcomms._backend_wrapper, torchcomms.hooks
        assert c10d._TORCHCOMM_AVAILABLE is True, "torch did not import torchcomms"
        assert c10d._BackendWrapper is torchcomms._backend_wrapper._BackendWrapper
        assert c10d.FlightRecorderHook is torchcomms.hooks.FlightRecorderHook
        print("ok")
    """)
    res = _run([sys.executable, "-c", code])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_the_switch_makes_torch_use_torchcomms_in_a_fresh_interpreter() -> None:
    code = "import torch.distributed.distributed_c10d as c; print(c._use_torchcomms_enabled())"
    assert _run([sys.executable, "-c", code], env={SWITCH: "1"}).stdout.strip() == "True"


def _losses(stdout: str) -> list[tuple[float, float]]:
    return [
        (float(a), float(b)) for a, b in re.findall(r"loss (\S+) reference (\S+) rel\.diff", stdout)
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "script,nproc,extra",
    [
        ("examples/fsdp2.py", 2, ["--timing-steps", "5"]),
        ("examples/ddp.py", 2, []),
        ("examples/mesh_2d.py", 4, []),
    ],
)
def test_example_matches_the_reference_under_torchrun(
    script: str, nproc: int, extra: list[str]
) -> None:
    res = _run([*TORCHRUN, "--nproc-per-node", str(nproc), script, *extra])
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    losses = _losses(res.stdout)
    assert len(losses) == 5, res.stdout
    for ours, ref in losses:
        assert abs(ours - ref) <= 1e-5 * abs(ref)
    assert "matches the reference: True" in res.stdout


def _results(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^(rank \d+ [^:]+): (.*)$", stdout, flags=re.M))


@pytest.mark.slow
def test_an_unchanged_script_runs_on_torchcomms_with_only_the_switch() -> None:
    cmd = [*TORCHRUN, "--nproc-per-node", "2", "examples/unchanged_script.py"]
    plain = _run(cmd)
    switched = _run(cmd, env={SWITCH: "1"})
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert switched.returncode == 0, switched.stderr[-3000:]
    a, b = _results(plain.stdout), _results(switched.stdout)
    kinds = {"group type", "communicators"}
    same = {k for k in a if k.split(" ", 2)[2] not in kinds}
    assert len(same) == 2 * 10, a
    assert {k: a[k] for k in same} == {k: b[k] for k in same}
    for rank in (0, 1):
        assert a[f"rank {rank} group type"] == "ProcessGroup ProcessGroup"
        assert a[f"rank {rank} communicators"] == "[]"
        assert b[f"rank {rank} group type"] == "_BackendWrapper _BackendWrapper"
        assert b[f"rank {rank} communicators"] == "['TorchComm', 'TorchComm']"
