"""The watchdog of blocking MPI calls: a timeout MPI cannot raise ends the job instead.

Small collectives run as blocking MPI calls (see ``MpiBackend``), which MPI can neither
time out nor cancel. Before such a call the backend stores ``(operation, seconds)`` in its
``_watch`` slot and clears it after; one daemon thread per process looks at every
backend's slot a few times a second. A slot that holds the same call for longer than its
seconds means a peer never arrived: the thread reports the operation on stderr and calls
``MPI_Abort`` on the backend's communicator, which ends the job, as torch's NCCL
watchdog does.

The thread keeps a reference to the slot object it last saw, so a new call (a new tuple)
can never be mistaken for the old one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from typing import Any

#: Seconds between two looks at the slots: a stuck call is reported at most about this
#: late.
TICK_S = 0.2
#: Exit code of the aborted job.
EXIT_CODE = 124

_watched: weakref.WeakSet[Any] = weakref.WeakSet()
_thread: threading.Thread | None = None
_lock = threading.Lock()


def watch(backend: Any) -> None:
    """Look after ``backend``'s ``_watch`` slot from now on (starts the thread once)."""
    global _thread
    with _lock:
        _watched.add(backend)
        if _thread is None:
            _thread = threading.Thread(target=_run, name="torchcomms-mpi-watchdog", daemon=True)
            _thread.start()


def _run() -> None:
    seen: dict[int, tuple[Any, float]] = {}
    while True:
        time.sleep(TICK_S)
        now = time.monotonic()
        live = {}
        for backend in list(_watched):
            call = backend._watch
            if call is None:
                continue
            key = id(backend)
            last = seen.get(key)
            if last is None or last[0] is not call:
                live[key] = (call, now)
                continue
            live[key] = last
            if now - last[1] > call[1]:
                _expire(backend, call)
        seen = live


def _expire(backend: Any, call: tuple[str, float]) -> None:
    what, seconds = call
    sys.stderr.write(
        f"torchcomms-mpi watchdog: {what} on communicator {backend.comm_name!r} (rank "
        f"{backend.get_rank()} of {backend.get_size()}) did not complete within {seconds:g} s; "
        f"a peer may have died, hung or issued a different operation. A blocking MPI call "
        f"cannot be cancelled, so the watchdog aborts the MPI job. Collectives of more than "
        f"TORCHCOMM_MPI_BLOCKING_BYTES bytes are nonblocking and raise CommTimeoutError "
        f"instead; set it to 0 to make every collective so\n"
    )
    sys.stderr.flush()
    unlink_job_segments()
    try:
        comm = backend._comm
        if comm is None:  # freed meanwhile: end the job through the world
            from mpi4py import MPI

            comm = MPI.COMM_WORLD
        comm.Abort(EXIT_CODE)
    finally:
        # MPI_Abort does not return; should it fail, the stuck call must still end.
        os._exit(EXIT_CODE)


#: Where MPICH's shared-memory segments live, and how their names start.
_SHM_DIR = "/dev/shm/"
_MPICH_PREFIX = "mpich_shm_"


def unlink_job_segments(maps: str = "/proc/self/maps") -> list[str]:
    """Remove the names of the MPICH shared-memory segments this process has mapped.

    MPICH removes them in ``MPI_Finalize``; a job ended by ``MPI_Abort`` never gets
    there, and each segment (2 MiB and more) would stay in /dev/shm until reboot. The
    ranks still mapping one keep it until they exit; only its name goes. Returns the
    paths removed (none where /proc is missing).
    """
    try:
        with open(maps, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    removed: list[str] = []
    for line in lines:
        path = line.rsplit(None, 1)[-1] if line.strip() else ""
        if path.endswith(" (deleted)") or not path.startswith(_SHM_DIR + _MPICH_PREFIX):
            continue
        if "/" in path[len(_SHM_DIR) :] or path in removed:
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        removed.append(path)
    return removed
