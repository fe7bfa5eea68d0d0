"""One-sided windows on MPI RMA: the engine under the core's ``TorchCommWindow``.

``tensor_register`` moves the tensor's data into memory MPI allocates for the window
(``Win.Allocate``: MPICH then reaches peers on the same host through shared memory,
about nine times the bandwidth of a window over user memory); the tensor object stays
the same, as with ``share_memory_()``, and ``tensor_deregister`` moves it back. Each rank
also allocates a window of ``size`` int64 signal counters. Both stay in a passive
``Lock_all`` epoch. ``put`` is ``MPI_Put`` completed by ``Win.Flush``; ``signal`` flushes
the data to the peer, then adds 1 to this rank's counter there with an atomic
``Accumulate``; ``wait_signal`` polls its own counter with ``Fetch_and_op(NO_OP)``.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

import torch
from mpi4py import MPI

from torchcomms_core.plugin import CommTimeoutError, TorchCommWinAccessType, settle

from .buffers import MPI_TYPES

_COUNTER = MPI.INT64_T
#: Seconds wait_signal polls flat out before napping ``_NAP_S`` between polls.
_BUSY_S = 2.0
_NAP_S = 0.0002


class _FlushWork:
    """An issued put: ``wait()`` flushes it to the target (remote completion)."""

    __slots__ = ("_win", "_rank", "_keep", "_done")

    def __init__(self, win: Any, rank: int, keep: torch.Tensor) -> None:
        self._keep: torch.Tensor | None  # the source stays alive until the flush
        self._win, self._rank, self._keep, self._done = win, rank, keep, False

    def wait(self) -> bool:
        if not self._done:
            self._win.Flush(self._rank)
            self._done = True
            self._keep = None
        return True

    def is_completed(self) -> bool:
        return self._done


class _SignalWaitWork:
    """Polls this rank's counter for ``peer`` until it passes ``target`` or time runs out."""

    __slots__ = ("_engine", "_peer", "_target", "_deadline", "_seconds", "_done")

    def __init__(self, engine: MpiWindowEngine, peer: int, target: int, seconds: float) -> None:
        self._engine, self._peer, self._target = engine, peer, target
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds
        self._done = False

    def is_completed(self) -> bool:
        if not self._done and self._engine._count(self._peer) >= self._target:
            self._engine._arrived()
            self._done = True
        return self._done

    def wait(self) -> bool:
        # Polling flat out at first: MPI's passive-target progress happens in these calls.
        busy_until = time.monotonic() + _BUSY_S
        while not self.is_completed():
            now = time.monotonic()
            if now > self._deadline:
                raise CommTimeoutError(
                    f"wait_signal: no signal from rank {self._peer} within {self._seconds:g} s "
                    f"(timed out); the peer must call window.signal({self._engine.rank}, ...)"
                )
            if now > busy_until:
                time.sleep(_NAP_S)
            else:
                os.sched_yield()  # let the peer run on a machine with more ranks than cores
        return True


class MpiWindowEngine:
    """MPI RMA windows for one ``TorchCommWindow`` (see the module docstring).

    ``comm`` is the communicator's ``mpi4py`` intracomm; ``open_windows`` is the backend's
    list of live window engines, which this one leaves when freed.
    """

    def __init__(self, comm: Any, open_windows: list[Any]) -> None:
        self._open = open_windows
        self._comm = comm
        self.rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._data: Any = None
        self._signals: Any = None
        self._tensor: torch.Tensor | None = None
        self._waited = [0] * self._size
        self._one = torch.ones(1, dtype=torch.int64)
        self._got = torch.zeros(1, dtype=torch.int64)

    def register(self, tensor: torch.Tensor) -> list[int]:
        comm = self._comm
        numels: list[int] = comm.allgather(tensor.numel())
        if tensor.dtype not in MPI_TYPES:
            raise ValueError(f"windows cannot hold {tensor.dtype}")
        nbytes = tensor.numel() * tensor.element_size()
        self._data = MPI.Win.Allocate(nbytes, tensor.element_size(), MPI.INFO_NULL, comm)
        if nbytes:
            raw = torch.frombuffer(self._data.tomemory(), dtype=torch.uint8)[:nbytes]
            shared = raw.view(tensor.dtype).view(tensor.shape)
            shared.copy_(tensor)
            # The caller's tensor now lives in the window. torch's stub lacks set_(Tensor).
            tensor.set_(shared)  # type: ignore[call-overload]
        self._signals = MPI.Win.Allocate(8 * self._size, 8, MPI.INFO_NULL, comm)
        counters = torch.frombuffer(self._signals.tomemory(), dtype=torch.int64)
        counters.zero_()
        self._tensor = tensor
        self._waited = [0] * self._size
        comm.Barrier()  # every counter is zero before anyone signals
        self._data.Lock_all(MPI.MODE_NOCHECK)
        self._signals.Lock_all(MPI.MODE_NOCHECK)
        return numels

    def deregister(self) -> None:
        self._comm.Barrier()  # no peer still writes into this rank's window
        self.free()

    def free(self, abort: bool = False) -> None:
        tensor = self._tensor
        if tensor is not None and self._data is not None:
            # Back to private memory before MPI frees the window (torch's stub lacks
            # set_(Tensor)).
            tensor.set_(tensor.clone())  # type: ignore[call-overload]
        for win in (self._data, self._signals):
            if win is None:
                continue
            try:
                win.Unlock_all()
                win.Free()
            except MPI.Exception:  # the engine is going away anyway
                pass
        self._data = self._signals = None
        self._tensor = None
        if self in self._open:
            self._open.remove(self)

    def put(
        self, tensor: torch.Tensor, dst_rank: int, offset: int, async_op: bool, timeout: timedelta
    ) -> Any:
        if not tensor.numel():
            return None
        origin = [MPI.buffer.fromaddress(tensor.data_ptr(), tensor.nbytes), MPI_TYPES[tensor.dtype]]
        win = self._data
        win.Put(origin, dst_rank, (offset, tensor.numel(), MPI_TYPES[tensor.dtype]))
        return settle(_FlushWork(win, dst_rank, tensor), async_op)

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._data.Flush(peer_rank)  # the data lands before the signal can be seen
        one = [MPI.buffer.fromaddress(self._one.data_ptr(), 8), 1, _COUNTER]
        self._signals.Accumulate(one, peer_rank, (self.rank, 1, _COUNTER), MPI.SUM)
        self._signals.Flush(peer_rank)
        return None

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._waited[peer_rank] += 1
        seconds = timeout.total_seconds()
        return settle(_SignalWaitWork(self, peer_rank, self._waited[peer_rank], seconds), async_op)

    def _count(self, peer: int) -> int:
        got = [MPI.buffer.fromaddress(self._got.data_ptr(), 8), 1, _COUNTER]
        one = [MPI.buffer.fromaddress(self._one.data_ptr(), 8), 1, _COUNTER]
        self._signals.Fetch_and_op(one, got, self.rank, peer, MPI.NO_OP)
        self._signals.Flush(self.rank)
        return int(self._got.item())

    def _arrived(self) -> None:
        # Make the peer's puts visible to this rank's loads (separate memory model).
        self._data.Sync()

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        return TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE

    def map_remote(self, rank: int) -> torch.Tensor:
        raise NotImplementedError("MPI windows are not directly addressable")
