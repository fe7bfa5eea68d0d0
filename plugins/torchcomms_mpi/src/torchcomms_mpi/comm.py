"""``MpiComm``: the part of the mpi backend every operation stands on.

It owns one duplicated MPI communicator: its set-up and release (``init``, ``finalize``,
``abort``), rank and size, the watchdog slot for blocking calls
(:mod:`~torchcomms_mpi.watchdog`), the conversion of an issued MPI request into a
completed call or an :class:`~torchcomms_mpi.work.MpiWork`, and the RMA windows. The
operations themselves are :class:`~torchcomms_mpi.backend.MpiBackend`'s, its only
subclass; the calls it hands the core's lean lane are made by :mod:`~torchcomms_mpi.lean`.

May import: torch, mpi4py (inside functions: importing ``mpi4py.MPI`` initialises MPI),
``torchcomms_core.plugin`` and this package's ``buffers``, ``watchdog``, ``work`` and
``window``; never ``backend`` or ``lean``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    BootstrapError,
    CommOptions,
    StoredRankAndSize,
    TorchCommBackend,
    env_count,
)

_UNSET = object()

#: Environment variable: collectives of at most this many bytes per rank are blocking MPI
#: calls (0: none are).
BLOCKING_BYTES_ENV = "TORCHCOMM_MPI_BLOCKING_BYTES"
DEFAULT_BLOCKING_BYTES = 65536


def blocking_bytes() -> int:
    """``TORCHCOMM_MPI_BLOCKING_BYTES`` (default 64 KiB); must be the same on every rank."""
    return env_count(
        BLOCKING_BYTES_ENV,
        DEFAULT_BLOCKING_BYTES,
        lambda raw: BootstrapError(
            f"{BLOCKING_BYTES_ENV}={raw!r} is not a byte count; set a whole number >= 0 "
            f"(the same on every rank; 0 makes every collective nonblocking), or unset it for "
            f"the default {DEFAULT_BLOCKING_BYTES}"
        ),
    )


class MpiComm(StoredRankAndSize, TorchCommBackend):
    """One duplicated MPI communicator and its plumbing (see the module docstring)."""

    # -- lifecycle --------------------------------------------------------------------

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        wrank, wsize = world.Get_rank(), world.Get_size()
        if (wrank, wsize) != (options.rank, options.size):
            if wsize == 1:
                raise BootstrapError(
                    f"the mpi backend needs its ranks started by mpiexec, but MPI sees a single "
                    f"process while the environment says rank {options.rank} of {options.size}. "
                    f"Launch with `mpiexec -n {options.size} python script.py`"
                )
            raise BootstrapError(
                f"MPI says this process is rank {wrank} of {wsize}, but the environment says "
                f"rank {options.rank} of {options.size}; unset TORCHCOMM_RANK/TORCHCOMM_SIZE, "
                f"RANK/WORLD_SIZE when launching with mpiexec"
            )
        self._setup(world.Dup(), name, options)

    def _setup(self, comm: Any, name: str, options: CommOptions) -> None:
        from mpi4py import MPI

        from . import buffers, watchdog, work

        # The all_reduce fast path's lookups (mpi4py is imported here, not at module import,
        # because importing mpi4py.MPI initialises MPI).
        self._fa, self._types, self._ops = buffers._fromaddress, buffers.MPI_TYPES, buffers._OPS

        self._MPI = MPI
        self._b = buffers
        self._comm = comm
        comm.Set_name(name)
        self._rank: int = comm.Get_rank()
        self._size: int = comm.Get_size()
        self._pending: set[Any] = set()
        # The last timeout seen and its seconds: most calls pass the same object.
        self._td: Any = _UNSET
        self._ts = 0.0
        self._complete = work.complete
        self._test = MPI.Request.Test
        # The largest MPI tag of this library (MPI_TAG_UB), read on the first tagged call.
        self._tag_ub: int | None = None
        self._windows: list[Any] = []
        # Collectives on at most this many bytes per rank are blocking MPI calls; the
        # watchdog reads ``_watch``, ``(operation, seconds)`` while one runs.
        self._small = blocking_bytes()
        self._watch: tuple[str, float] | None = None
        if self._small:
            watchdog.watch(self)

    def finalize(self) -> None:
        self._release(abort=False)

    def abort(self) -> None:
        """Abandon operations in flight (receives are cancelled) and free the communicator."""
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        comm = getattr(self, "_comm", None)
        if comm is None:
            return
        self._comm = None
        if self._MPI.Is_finalized():  # released at interpreter exit, after MPI_Finalize
            return
        for work in list(self._pending):
            if abort:
                work.cancel()
            else:
                try:
                    work.wait()
                except Exception:  # finalize must release even a failed communicator
                    work.cancel()
        if abort:
            # MPI_Win_free synchronises with the peers, which an abort must not wait for:
            # the windows stay with MPI until it finalizes.
            self._windows.clear()
        for window in list(self._windows):
            window.free()
        if abort and self._watch is not None:
            # Another thread is inside a blocking call on this communicator: freeing it
            # under that call is undefined in MPI. It stays with MPI until it finalizes.
            return
        try:
            comm.Free()
        except self._MPI.Exception:  # an engine that already gave up: nothing to free
            pass

    def get_backend_name(self) -> str:
        return "mpi"

    @property
    def engine(self) -> Any:
        """The ``mpi4py.MPI.Intracomm`` under this communicator.

        Reach it with ``comm.get_backend_impl().engine``.
        """
        return self._comm

    # -- plumbing ---------------------------------------------------------------------

    def _seconds(self, timeout: timedelta | None) -> float:
        if timeout is self._td:
            return self._ts
        seconds = (timeout or self.options.timeout or timedelta(seconds=600)).total_seconds()
        self._td, self._ts = timeout, seconds
        return seconds

    def _finish(
        self, what: str, async_op: bool, timeout: timedelta | None, req: Any, keep: Any
    ) -> Any:
        """An issued request: a work for ``async_op``, else completed here (``None``)."""
        if async_op:
            return self._work(what, timeout, [req], keep)
        if not self._test(req):
            self._complete([req], self._seconds(timeout), what)
        return None

    def _work(
        self,
        what: str,
        timeout: timedelta | None,
        reqs: list[Any],
        keep: Any = None,
        then: Any = None,
    ) -> Any:
        from .work import MpiWork

        return MpiWork(reqs, self._seconds(timeout), what, keep, self._pending, then)

    def _blocking(
        self, what: str, timeout: timedelta | None, call: Any, args: tuple[Any, ...]
    ) -> None:
        """Run the blocking MPI ``call`` under the watchdog (complete on return)."""
        self._watch = (what, self._seconds(timeout))
        try:
            call(*args)
        finally:
            self._watch = None

    def _collective(
        self,
        what: str,
        async_op: bool,
        timeout: timedelta | None,
        nonblocking: str,
        args: tuple[Any, ...],
        keep: Any,
    ) -> Any:
        req = getattr(self._comm, nonblocking)(*args)
        return self._finish(what, async_op, timeout, req, keep)

    # -- windows ----------------------------------------------------------------------

    def new_window(self) -> Any:
        """An MPI RMA window engine for the core's ``TorchCommWindow``."""
        from .window import MpiWindowEngine

        engine = MpiWindowEngine(self._comm, self._windows)
        self._windows.append(engine)
        return engine
