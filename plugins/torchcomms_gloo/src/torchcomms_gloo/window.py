"""Same-host one-sided windows for gloo, on shared memory.

Each rank's window is a file in ``/dev/shm`` that every rank maps: ``int64`` signal
counters (one per peer) followed by the data. ``tensor_register`` moves the tensor's data
into it (like ``share_memory_()``: the same tensor object, now backed by shared memory)
and ``tensor_deregister`` moves it back. ``put`` is a copy into the peer's mapping;
``signal`` increments this rank's counter in the peer's segment (one writer per counter,
so no atomics are needed; x86 stores become visible in program order, so the data is
there before the count). Ranks on different hosts get a clear error: use the mpi backend.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import secrets
import socket
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms_core import CommStateError, CommTimeoutError, TorchCommWinAccessType

if TYPE_CHECKING:
    from .backend import GlooBackend

SHM_DIR = "/dev/shm"
#: Seconds wait_signal polls flat out before napping ``_NAP_S`` between polls.
_BUSY_S = 2.0
_NAP_S = 0.0002
#: Counter reads (tens of ns each) between two yields of the CPU while polling flat out.
_SPIN = 2000


def host_identity() -> str:
    """This machine's identity: host name and boot id (containers may share host names)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


class _Segment:
    """One mapped window file: ``counters`` (int64 per rank) and ``data`` (bytes)."""

    def __init__(self, path: str, nbytes: int, nranks: int, create: bool) -> None:
        self.path = path
        size = 8 * nranks + nbytes
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
        # The counters as Python ints: reading or bumping one costs tens of nanoseconds.
        self.words = memoryview(self.map)[: 8 * nranks].cast("q")
        self.data = raw[8 * nranks :]

    def close(self) -> None:
        self.words.release()
        self.counters = self.data = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:  # a tensor still views it; the mapping goes with that tensor
            pass


class GlooWindowEngine:
    """Shared-memory windows among the ranks of one host (see the module docstring)."""

    def __init__(self, backend: GlooBackend, index: int) -> None:
        self._backend = backend
        self._store = backend.options.store
        self._rank = backend.get_rank()
        self._size = backend.get_size()
        self._key = f"window/{index}"
        self._epoch = 0
        self._mine: _Segment | None = None
        self._peers: list[_Segment] = []
        self._views: list[torch.Tensor] = []
        self._bases: list[int] = []
        self._tensor: torch.Tensor | None = None
        self._waited = [0] * self._size

    # -- registration (collective) -----------------------------------------------------

    def register(self, tensor: torch.Tensor) -> list[int]:
        self._epoch += 1
        prefix = f"{self._key}/{self._epoch}"
        path = os.path.join(SHM_DIR, f"torchcomms-{os.getpid()}-{secrets.token_hex(6)}")
        me = {"host": host_identity(), "path": path, "numel": tensor.numel()}
        self._store.set(f"{prefix}/{self._rank}", json.dumps(me))
        timeout = self._backend.options.timeout or timedelta(seconds=600)
        peers = [json.loads(self._store.get(f"{prefix}/{r}")) for r in range(self._size)]
        hosts: dict[str, list[int]] = {}
        for r, info in enumerate(peers):
            hosts.setdefault(info["host"], []).append(r)
        if len(hosts) > 1:
            where = "; ".join(f"ranks {rs} on {h.split('/')[0]}" for h, rs in hosts.items())
            raise CommStateError(
                f"new_window: gloo windows use shared memory, so every rank must run on one "
                f"host, but {where}. Use the mpi backend (torchcomms-mpi) for windows across "
                f"hosts"
            )
        if not os.path.isdir(SHM_DIR):
            raise CommStateError(
                f"new_window: gloo windows need {SHM_DIR} (Linux shared "
                f"memory); use the mpi backend here"
            )
        nbytes = tensor.numel() * tensor.element_size()
        mine = _Segment(path, nbytes, self._size, create=True)
        mine.counters.zero_()
        shared = mine.data[:nbytes].view(tensor.dtype).view(tensor.shape)
        shared.copy_(tensor)
        # The caller's tensor now lives in the window. torch's stub lacks set_(Tensor).
        tensor.set_(shared)  # type: ignore[call-overload]
        self._mine, self._tensor = mine, tensor
        self._waited = [0] * self._size
        self._barrier(timeout)  # every segment exists and is zeroed
        self._peers = [
            mine
            if r == self._rank
            else _Segment(
                info["path"], info["numel"] * tensor.element_size(), self._size, create=False
            )
            for r, info in enumerate(peers)
        ]
        self._views = [
            seg.data[: info["numel"] * tensor.element_size()].view(tensor.dtype)
            for seg, info in zip(self._peers, peers, strict=True)
        ]
        self._bases = [view.data_ptr() for view in self._views]
        self._barrier(timeout)  # everyone mapped everyone: the files can go
        os.unlink(path)
        return [info["numel"] for info in peers]

    def deregister(self) -> None:
        timeout = self._backend.options.timeout or timedelta(seconds=600)
        self._barrier(timeout)  # no peer still writes into this rank's segment
        self.free()

    def free(self, abort: bool = False) -> None:
        tensor = self._tensor
        if tensor is not None:
            # Back to private memory, contents kept. torch's stub lacks set_(Tensor).
            tensor.set_(tensor.clone())  # type: ignore[call-overload]
        self._tensor = None
        self._views, self._bases = [], []
        for seg in self._peers:
            if seg is not None:
                seg.close()
        self._peers, self._mine = [], None

    def _barrier(self, timeout: timedelta) -> None:
        self._backend.barrier(False, timeout=timeout)

    # -- one-sided operations ----------------------------------------------------------

    def put(
        self, tensor: torch.Tensor, dst_rank: int, offset: int, async_op: bool, timeout: timedelta
    ) -> Any:
        # One memcpy into the peer's mapping: no tensor views made per call.
        size = tensor.element_size()
        ctypes.memmove(
            self._bases[dst_rank] + offset * size, tensor.data_ptr(), tensor.numel() * size
        )
        return None

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        words = self._peers[peer_rank].words
        words[self._rank] += 1  # this rank is the only writer of this counter
        return None

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._waited[peer_rank] += 1
        work = _CounterWait(
            self._mine.words,  # type: ignore[union-attr]
            peer_rank,
            self._waited[peer_rank],
            timeout.total_seconds(),
            self._rank,
        )
        if async_op:
            return work
        work.wait()
        return None

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        return TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED

    def map_remote(self, rank: int) -> torch.Tensor:
        return self._views[rank]


class _CounterWait:
    """Waits until ``counters[peer]`` reaches ``target`` (polling with a growing nap)."""

    __slots__ = ("_counters", "_peer", "_target", "_deadline", "_seconds", "_rank")

    def __init__(
        self, counters: memoryview, peer: int, target: int, seconds: float, rank: int
    ) -> None:
        self._counters, self._peer, self._target = counters, peer, target
        self._seconds, self._rank = seconds, rank
        self._deadline = time.monotonic() + seconds

    def is_completed(self) -> bool:
        return self._counters[self._peer] >= self._target

    def wait(self) -> bool:
        busy_until = time.monotonic() + _BUSY_S
        counters, peer, target = self._counters, self._peer, self._target
        while True:
            for _ in range(_SPIN):  # a signal lands within microseconds of the peer's call
                if counters[peer] >= target:
                    return True
            os.sched_yield()  # let the peer run on a machine with more ranks than cores
            now = time.monotonic()
            if now > self._deadline:
                raise CommTimeoutError(
                    f"wait_signal: no signal from rank {self._peer} within {self._seconds:g} s "
                    f"(timed out); the peer must call window.signal({self._rank}, ...)"
                )
            time.sleep(_NAP_S if now > busy_until else 0)
