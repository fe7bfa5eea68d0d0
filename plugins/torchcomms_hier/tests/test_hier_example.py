"""examples/heterogeneous.py launched as a user would: one torchrun per host, each host on
its own local backend."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import torchcomms

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "heterogeneous.py"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
def test_two_torchruns_each_host_on_its_own_backend() -> None:
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).parent / "torchrun")
    first = "shm" if "shm" in torchcomms.available_backends() else "gloo"
    port = _free_port()
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "MASTER_", "TORCHELASTIC_"))
    }
    procs = []
    for node, (host, backend) in enumerate([("host-a", first), ("host-b", "gloo")]):
        env = {**base, "TORCHCOMM_HOST_ID": host, "TORCHCOMM_LOCAL_BACKEND": backend}
        cmd = [
            torchrun,
            "--nnodes",
            "2",
            "--node-rank",
            str(node),
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(EXAMPLE),
            "--elements",
            "100003",
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=180)[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = "\n".join(outputs)
    assert all(p.returncode == 0 for p in procs), text[-5000:]
    assert "results equal flat gloo's on every rank: True" in text
    for rank in (0, 1):
        assert f"rank {rank}/4 on host-a: local={first}:{rank}/2, rail=gloo:0/2" in text
    for rank in (2, 3):
        assert f"rank {rank}/4 on host-b: local=gloo:{rank - 2}/2, rail=gloo:1/2" in text
