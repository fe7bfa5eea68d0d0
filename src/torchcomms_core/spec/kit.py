"""Small helpers backend authors share: what several backends would otherwise each write.

- :data:`ELEMENTWISE_REDUCE`: torch's element-wise kernel for each basic reduction, for
  backends that reduce received data themselves;
- :func:`displacements`: the offsets of consecutive blocks of the given counts;
- :func:`env_count`: a byte or rank count read from an environment variable, checked;
- :func:`usable_cores`: the cores this process may run on (its affinity);
- :func:`launcher_local_ranks`: the ranks the launcher started on this machine;
- :class:`StoredRankAndSize`: ``get_rank``, ``get_size`` and ``get_comm_name`` answered
  from the fields a backend sets in ``init``;
- :class:`WindowPeers`: what a window engine uses of the backend that made it;
- :class:`SignalFile`: one window file in ``/dev/shm``, mapped: ``int64`` signal counters
  (one per rank) followed by the window's data.

The works and tensor helpers every backend may use (``settle``, ``overlaps``,
``flat_chunks``, ``split_dim0``, ...) are in :mod:`torchcomms_core.spec.work`. Plugins
reach both through ``torchcomms_core.plugin``.

May import: torch, the standard library, and ``torchcomms_core.operations`` and
``torchcomms_core.foundation``; nothing above the spec.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch

from torchcomms_core.operations.reduce_op import RedOpType

#: torch's element-wise kernel (``fn(a, b, out=...)``) for each basic reduction; AVG and
#: PREMUL_SUM are not here (the core turns them into SUM and a scaling step).
ELEMENTWISE_REDUCE: dict[RedOpType, Callable[..., torch.Tensor]] = {
    RedOpType.SUM: torch.add,
    RedOpType.PRODUCT: torch.mul,
    RedOpType.MIN: torch.minimum,
    RedOpType.MAX: torch.maximum,
    RedOpType.BAND: torch.bitwise_and,
    RedOpType.BOR: torch.bitwise_or,
    RedOpType.BXOR: torch.bitwise_xor,
}


def displacements(counts: Sequence[int]) -> list[int]:
    """Where each of consecutive blocks of ``counts`` starts: ``[0, c0, c0 + c1, ...]``."""
    return list(itertools.accumulate(counts[:-1], initial=0)) if counts else []


def env_count(name: str, default: int, error: Callable[[str], Exception]) -> int:
    """The whole number ``>= 0`` in environment variable ``name``, or ``default`` when it is
    unset or blank. Anything else raises ``error(raw)`` (``raw``: the variable's value), an
    exception that says what to set."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise error(raw)
    return value


#: What launchers set to the number of ranks on this machine (torchrun, Open MPI, MPICH,
#: Slurm's tasks on this node), in the order :func:`launcher_local_ranks` reads them.
LOCAL_SIZE_VARIABLES: tuple[str, ...] = (
    "LOCAL_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "SLURM_NTASKS_PER_NODE",
)


def launcher_local_ranks() -> int | None:
    """The number of ranks the launcher started on this machine (``None``: it does not
    say). With :func:`usable_cores` it tells whether ranks share cores, which a
    communicator of a few of them cannot see from its own size."""
    for name in LOCAL_SIZE_VARIABLES:
        raw = os.environ.get(name, "").strip()
        if raw.isdigit() and int(raw) > 0:
            return int(raw)
    return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, else the machine's count.

    Backends compare it with the ranks of a machine to tell whether they share cores."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class StoredRankAndSize:
    """``get_rank``, ``get_size`` and ``get_comm_name`` from fields: ``_rank`` and ``_size``,
    which the backend sets in ``init`` (and ``split``, ``reconfigure_engine``), and the
    ``comm_name`` the core binds. Put it before ``TorchCommBackend`` among the bases:
    ``class MyBackend(StoredRankAndSize, TorchCommBackend)``."""

    _rank: int
    _size: int
    comm_name: str

    def get_rank(self) -> int:
        """This process's rank in the communicator."""
        return self._rank

    def get_size(self) -> int:
        """The number of ranks in the communicator."""
        return self._size

    def get_comm_name(self) -> str:
        """The communicator's name, as given to ``init``."""
        return self.comm_name


class WindowPeers(Protocol):
    """What a window engine uses of the backend that made it: this rank, the number of
    ranks and a barrier among them (every ``TorchCommBackend`` has them). A window module
    types its backend with this (or a protocol extending it) instead of importing the
    backend's class, which imports the window module."""

    def get_rank(self) -> int:
        """This process's rank in the communicator."""
        ...

    def get_size(self) -> int:
        """The number of ranks in the communicator."""
        ...

    def barrier(self, async_op: bool, *, timeout: timedelta | None = None) -> Any:
        """Return once every rank called it (``async_op=False``)."""
        ...


class SignalFile:
    """One rank's window file in ``/dev/shm``, mapped by every rank of the window.

    Layout: ``nranks`` ``int64`` signal counters (counter ``r`` written by rank ``r`` only,
    so no atomics are needed), then ``nbytes`` of data. ``words`` are the counters as
    Python ints (reading or bumping one costs tens of nanoseconds), ``counters`` the same
    memory as a tensor, ``data`` the data bytes as a ``uint8`` tensor. ``create`` makes the
    file (zero-filled), else an existing one is opened.
    """

    def __init__(self, path: str, nbytes: int, nranks: int, create: bool) -> None:
        self.path = path
        size = 8 * nranks + max(nbytes, 1)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        raw = torch.frombuffer(self.map, dtype=torch.uint8)
        self.counters = raw[: 8 * nranks].view(torch.int64)
        self.words = memoryview(self.map)[: 8 * nranks].cast("q")
        self.data = raw[8 * nranks : 8 * nranks + nbytes]

    def close(self) -> None:
        """Unmap the file (the mapping stays while a tensor still views it)."""
        self.words.release()
        self.counters = self.data = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:  # a tensor still views it; the mapping goes with that tensor
            pass
