"""Start a :class:`~torchcomms_core.testing.pool.RankPool`'s ranks with ``mpiexec``.

Backends whose engine is started by an MPI launcher (the mpi backend) need their ranks to
be MPI processes. ``mpiexec -n N python -m torchcomms_core.testing._mpi_rank ADDRESS DIR``
starts them; each connects back to the pool and then serves test bodies like a spawned rank.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import secrets
import signal
import subprocess
import sys
import threading
from typing import Any

from torchcomms_core.bench.mpiexec import find_mpiexec

#: What each MPI process runs (``_mpi_rank`` serves test bodies like a spawned rank).
_RANK_MODULE = "torchcomms_core.testing._mpi_rank"

__all__ = ["MpiRank", "find_mpiexec", "mpiexec_unavailable", "start"]

#: Launcher variables the ranks must not inherit: their rank and size come from mpiexec.
_FOREIGN_RANK_VARS = (
    "TORCHCOMM_RANK",
    "TORCHCOMM_SIZE",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "TORCHCOMM_LOCAL_RANK",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
)


def mpiexec_unavailable() -> str | None:
    """Why ranks cannot be started with ``mpiexec`` here, or ``None`` when they can."""
    if find_mpiexec() is None:
        return "mpiexec not found (pip install mpich mpi4py)"
    try:
        import importlib.util

        if importlib.util.find_spec("mpi4py") is None:
            return "mpi4py is not installed (pip install mpi4py mpich)"
    except ImportError:
        return "mpi4py is not importable"
    return None


class MpiRank:
    """The part of ``multiprocessing.Process`` the pool uses, for one mpiexec-started rank."""

    sentinel = None  # deaths show up as a closed connection instead

    def __init__(self, rank: int, pid: int, job: subprocess.Popen[bytes]) -> None:
        self.rank = rank
        self.pid = pid
        self._job = job

    def is_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except OSError:
            return False
        return True

    @property
    def exitcode(self) -> int | None:
        return None if self.is_alive() else self._job.poll()

    def join(self, timeout: float | None = None) -> None:
        try:
            self._job.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        # A rank killed before MPI_Finalize leaves MPICH's shared-memory segment behind:
        # note the ones it maps, and remove them once it is gone.
        segments = mapped_mpich_segments(self.pid)
        for pid in (self.pid,):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            os.killpg(self._job.pid, signal.SIGKILL)
        except OSError:
            pass
        for path in segments:
            try:
                os.unlink(path)
            except OSError:
                pass


def mapped_mpich_segments(pid: int) -> list[str]:
    """The MPICH shared-memory segments (``/dev/shm/mpich_shm_*``) process ``pid`` maps."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    found: list[str] = []
    for line in lines:
        path = line.rsplit(None, 1)[-1] if line.strip() else ""
        name = path[len("/dev/shm/") :]
        if path.startswith("/dev/shm/mpich_shm_") and "/" not in name and path not in found:
            found.append(path)
    return found


def start(
    world_size: int, env: dict[str, str], tmpdir: str, timeout: float = 120.0
) -> tuple[list[MpiRank], list[Any], list[str]]:
    """Launch ``world_size`` ranks under mpiexec; return ranks, connections and stack files."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("RankPool(launcher='mpiexec'): mpiexec not found; pip install mpich")
    authkey = secrets.token_bytes(16)
    key_file = os.path.join(tmpdir, "authkey")
    with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
        f.write(authkey)
    listener = multiprocessing.connection.Listener(("127.0.0.1", 0), authkey=authkey)
    host, port = listener.address
    child_env = {k: v for k, v in {**os.environ, **env}.items() if k not in _FOREIGN_RANK_VARS}
    # Like multiprocessing's spawn: the ranks import test bodies from the parent's path.
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # MPICH over UCX warns about every RMA key still cached at exit; keep test logs readable.
    child_env.setdefault("UCX_LOG_LEVEL", "error")
    job = subprocess.Popen(
        [
            mpiexec,
            "-n",
            str(world_size),
            sys.executable,
            "-m",
            _RANK_MODULE,
            f"{host}:{port}",
            tmpdir,
        ],
        env=child_env,
        start_new_session=True,
    )
    hellos: list[tuple[int, int, Any]] = []

    def accept() -> None:
        while len(hellos) < world_size:
            try:
                conn = listener.accept()
                rank, pid = conn.recv()
            except (OSError, EOFError, multiprocessing.AuthenticationError):
                return
            hellos.append((rank, pid, conn))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    thread.join(timeout)
    listener.close()
    if len(hellos) < world_size:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except OSError:
            pass
        raise RuntimeError(
            f"RankPool(launcher='mpiexec'): only {len(hellos)} of {world_size} ranks started by "
            f"{mpiexec} connected within {timeout:g} s (mpiexec exit status {job.poll()})"
        )
    hellos.sort(key=lambda h: h[0])
    ranks = [MpiRank(rank, pid, job) for rank, pid, _ in hellos]
    conns = [conn for _, _, conn in hellos]
    stacks = [os.path.join(tmpdir, f"rank{rank}.stacks") for rank, _, _ in hellos]
    return ranks, conns, stacks
