"""Run ``torchcomms bench`` under ``mpiexec`` for backends whose ranks must be MPI processes.

``torchcomms bench --backend mpi --nproc 4`` becomes ``mpiexec -n 4 python -m
torchcomms_core.cli bench --backend mpi --nproc 4``; each rank then runs in place.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from torchcomms_core.foundation import env as _env


def find_mpiexec() -> str | None:
    """``mpiexec`` of this Python environment (the MPICH wheel puts it there), else on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


def relaunch_under_mpiexec(
    nranks: int, argv: list[str] | None = None, label: str = "torchcomms bench"
) -> int:
    """Run this command again as ``nranks`` MPI ranks; return mpiexec's exit status."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        print(
            f"{label}: this backend's ranks are started by mpiexec, which is not installed: "
            f"pip install mpich mpi4py",
            file=sys.stderr,
        )
        return 1
    args = sys.argv[1:] if argv is None else argv
    # The ranks take their rank and size from mpiexec, not from a launcher around us.
    env = {
        k: v for k, v in os.environ.items() if k not in (_env.RANK, _env.SIZE, "RANK", "WORLD_SIZE")
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [mpiexec, "-n", str(nranks), sys.executable, "-m", "torchcomms_core.cli", *args]
    try:
        return subprocess.call(cmd, env=env)
    except KeyboardInterrupt:
        return 130
