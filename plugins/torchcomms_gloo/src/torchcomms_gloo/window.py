"""One-sided windows for gloo: shared memory among ranks that share it, else the transport.

Each rank's window is a file in ``/dev/shm`` that every rank maps: ``int64`` signal
counters (one per peer) followed by the data. ``tensor_register`` moves the tensor's data
into it (like ``share_memory_()``: the same tensor object, now backed by shared memory)
and ``tensor_deregister`` moves it back. ``put`` is a copy into the peer's mapping;
``signal`` increments this rank's counter in the peer's segment (one writer per counter,
so no atomics are needed; x86 stores become visible in program order, so the data is
there before the count).

Whether the ranks share memory is tested, not guessed from host names: each rank creates
a small segment and every other rank must see it with its contents (two containers on one
machine share host name and boot id but no ``/dev/shm``). Ranks that do not share it use
the installed transport (``torchcomms_gloo.transport_window``); ``TORCHCOMM_WINDOW_TRANSPORT``
(``auto``, ``shm`` or ``transport``) forces either path.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import socket
import time
from datetime import timedelta
from typing import Any, Protocol

import torch

from torchcomms_core.plugin import (
    CommInputError,
    CommStateError,
    CommTimeoutError,
    RdmaTransport,
    SignalFile,
    TorchCommWinAccessType,
    read_record,
    settle,
)

from .transport_window import TransportWindow, WindowHost

SHM_DIR = "/dev/shm"
#: How windows reach peers: ``auto`` (shared memory when every rank shares it, else the
#: transport), ``shm`` or ``transport``.
WINDOW_TRANSPORT = "TORCHCOMM_WINDOW_TRANSPORT"
MODES = ("auto", "shm", "transport")
#: Seconds wait_signal polls flat out before napping ``_NAP_S`` between polls.
_BUSY_S = 2.0
_NAP_S = 0.0002
#: Counter reads (tens of ns each) between two yields of the CPU while polling flat out.
_SPIN = 2000


def window_mode() -> str:
    """``TORCHCOMM_WINDOW_TRANSPORT`` (default ``auto``), checked."""
    mode = os.environ.get(WINDOW_TRANSPORT, "").strip().lower() or "auto"
    if mode not in MODES:
        raise CommInputError(
            f"{WINDOW_TRANSPORT}={mode!r} is not one of {', '.join(MODES)}; unset it or set "
            f"auto (shared memory where ranks share it, else the transport)"
        )
    return mode


def make_probe() -> tuple[str, str] | None:
    """A small segment in ``/dev/shm`` holding a random token: ``(path, token)``, or ``None``
    without ``/dev/shm``."""
    if not os.path.isdir(SHM_DIR):
        return None
    token = secrets.token_hex(16)
    path = os.path.join(SHM_DIR, f"torchcomms-probe-{os.getpid()}-{secrets.token_hex(6)}")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, token.encode("ascii"))
    finally:
        os.close(fd)
    return path, token


def sees_probe(path: str | None, token: str | None) -> bool:
    """Whether the segment another rank made is visible here with its contents."""
    if path is None or token is None:
        return False
    try:
        with open(path, "rb") as f:
            return f.read(64) == token.encode("ascii")
    except OSError:
        return False


def _host() -> str:
    return socket.gethostname()


#: The fields of a rank's segment and mode records (read_record checks their types).
_SEGMENT: dict[str, type | tuple[type, ...]] = {"path": str, "numel": int}
_MODE: dict[str, type | tuple[type, ...]] = {"mode": str, "host": str, "probe": (list, type(None))}


class GlooWindowEngine:
    """Windows on shared memory, or through ``TransportWindow`` (see the module docstring)."""

    def __init__(self, backend: WindowHost, index: int) -> None:
        self._backend = backend
        self._store = backend.options.store
        self._rank = backend.get_rank()
        self._size = backend.get_size()
        self._key = f"window/{index}"
        self._epoch = 0
        self._mine: SignalFile | None = None
        self._peers: list[SignalFile] = []
        self._views: list[torch.Tensor] = []
        self._bases: list[int] = []
        self._tensor: torch.Tensor | None = None
        self._waited = [0] * self._size
        #: The window of the current registration when it goes through the transport.
        self._remote: TransportWindow | None = None

    # -- registration (collective) -----------------------------------------------------

    def register(self, tensor: torch.Tensor) -> list[int]:
        self._epoch += 1
        prefix = f"{self._key}/{self._epoch}"
        timeout = self._backend.options.timeout or timedelta(seconds=600)
        self._waited = [0] * self._size
        if not self._shared_memory(prefix):
            self._remote = TransportWindow(self._backend, prefix, timeout)
            return self._remote.register(tensor)
        path = os.path.join(SHM_DIR, f"torchcomms-{os.getpid()}-{secrets.token_hex(6)}")
        me = {"path": path, "numel": tensor.numel()}
        self._store.set(f"{prefix}/{self._rank}", json.dumps(me))
        peers = [
            read_record(self._store.get(f"{prefix}/{r}"), f"{prefix}/{r}", _SEGMENT)
            for r in range(self._size)
        ]
        nbytes = tensor.numel() * tensor.element_size()
        mine = SignalFile(path, nbytes, self._size, create=True)
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
            else SignalFile(
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

    def _shared_memory(self, prefix: str) -> bool:
        """Whether this registration uses shared memory (the same answer on every rank).

        Every rank publishes its mode and a probe segment; the ranks share memory when each
        sees every other rank's segment with its token.
        """
        mode = window_mode()
        probe = make_probe() if mode != "transport" else None
        mine = {"mode": mode, "host": _host(), "probe": list(probe) if probe else None}
        store, rank, size = self._store, self._rank, self._size
        try:
            store.set(f"{prefix}/mode/{rank}", json.dumps(mine))
            everyone = [
                read_record(store.get(f"{prefix}/mode/{r}"), f"{prefix}/mode/{r}", _MODE)
                for r in range(size)
            ]
            modes = {info["mode"] for info in everyone}
            if len(modes) > 1:
                listing = ", ".join(f"rank {r}: {i['mode']}" for r, i in enumerate(everyone))
                raise CommStateError(
                    f"new_window: the ranks set {WINDOW_TRANSPORT} differently ({listing}); "
                    f"set the same value on every rank"
                )
            if mode == "transport":
                shared = False
            else:
                sees = all(
                    sees_probe(*(info["probe"] or (None, None)))
                    for r, info in enumerate(everyone)
                    if r != rank
                )
                store.set(f"{prefix}/sees/{rank}", "1" if sees and probe else "0")
                verdicts = [store.get(f"{prefix}/sees/{r}") for r in range(size)]
                shared = all(v == b"1" for v in verdicts)
        finally:
            if probe is not None and mode != "transport":
                # Every rank has looked once all verdicts are in (or this rank failed).
                try:
                    os.unlink(probe[0])
                except OSError:
                    pass
        if shared:
            return True
        if mode == "shm":
            blind = [r for r in range(size) if store.get(f"{prefix}/sees/{r}") != b"1"]
            raise CommStateError(
                f"new_window: {WINDOW_TRANSPORT}=shm, but the ranks do not share memory "
                f"(rank(s) {blind} cannot see the others' {SHM_DIR} segments: other hosts or "
                f"containers); set it to auto or transport and install a transport "
                f"(`pip install torchcomms-nixl`)"
            )
        if not RdmaTransport.supported():
            hosts = sorted({info["host"] for info in everyone})
            why = (
                f"{WINDOW_TRANSPORT}=transport"
                if mode == "transport"
                else f"the ranks do not share memory (hosts {', '.join(hosts)})"
            )
            raise CommStateError(
                f"new_window: {why}, so gloo windows need a transport across them, and none "
                f"can run here; install one (`pip install torchcomms-nixl`) or use the mpi "
                f"backend (torchcomms-mpi), whose windows are MPI RMA"
            )
        return False

    def deregister(self) -> None:
        timeout = self._backend.options.timeout or timedelta(seconds=600)
        if self._remote is not None:
            remote, self._remote = self._remote, None
            remote.deregister(timeout)
            return
        self._barrier(timeout)  # no peer still writes into this rank's segment
        self.free()

    def free(self, abort: bool = False) -> None:
        if self._remote is not None:
            remote, self._remote = self._remote, None
            remote.free(abort)
            return
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
        if self._remote is not None:
            return self._remote.put(tensor, dst_rank, offset, timeout)
        # One memcpy into the peer's mapping: no tensor views made per call.
        size = tensor.element_size()
        ctypes.memmove(
            self._bases[dst_rank] + offset * size, tensor.data_ptr(), tensor.numel() * size
        )
        return None

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        if self._remote is not None:
            return self._remote.signal(peer_rank, timeout)
        words = self._peers[peer_rank].words
        words[self._rank] += 1  # this rank is the only writer of this counter
        return None

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._waited[peer_rank] += 1
        counters = self._remote.counters if self._remote is not None else self._mine.words  # type: ignore[union-attr]
        work = _CounterWait(
            counters,
            peer_rank,
            self._waited[peer_rank],
            timeout.total_seconds(),
            self._rank,
        )
        return settle(work, async_op)

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        if self._remote is not None:
            return TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE
        return TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED

    def map_remote(self, rank: int) -> torch.Tensor:
        return self._views[rank]


class Counts(Protocol):
    """Signal counts by rank: mapped memory, or a transport's counts (``transport_window``)."""

    def __getitem__(self, peer: int, /) -> int: ...


class _CounterWait:
    """Waits until ``counters[peer]`` reaches ``target`` (polling with a growing nap)."""

    __slots__ = ("_counters", "_peer", "_target", "_deadline", "_seconds", "_rank")

    def __init__(self, counters: Counts, peer: int, target: int, seconds: float, rank: int) -> None:
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
