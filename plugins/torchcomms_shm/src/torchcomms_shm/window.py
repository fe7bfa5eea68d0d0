"""One-sided windows on shared memory.

Each registration gives every rank a file in ``/dev/shm`` holding ``int64`` signal
counters (one per peer, each written by that peer only) and then the registered data.
``register`` moves the caller's tensor into it (the same tensor object, now backed by
shared memory) and ``deregister`` moves it back to private memory. Every rank maps every
rank's file, and the files are unlinked as soon as all ranks mapped them. ``put`` is one
``memmove`` into the peer's mapping; ``signal`` bumps this rank's counter in the peer's
file after the data (x86 store order makes the data visible first, see ``segment``).
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    CommOperationError,
    SignalFile,
    TorchCommWinAccessType,
    WindowPeers,
    settle,
)

from . import segment as seg
from .lockstep import Lockstep


class ShmWindowEngine:
    """The ``WindowEngine`` of the shm backend (see the module docstring)."""

    def __init__(self, peers: WindowPeers, state: Lockstep, store: Any, index: int) -> None:
        """``peers``: the backend (rank, size, barrier); ``state``: its lockstep (the
        lock, waiting and timeout reporting of its calls); ``store``: its store."""
        self._b = peers
        self._st = state
        self._kv = store
        self._me = peers.get_rank()
        self._size = peers.get_size()
        self._key = f"shm/window/{index}"
        self._epoch = 0
        self._files: list[SignalFile] = []
        self._views: list[torch.Tensor] = []
        self._bases: list[int] = []
        self._tensor: torch.Tensor | None = None
        self._waited = [0] * self._size

    def _timeout(self) -> timedelta:
        return timedelta(seconds=self._st.default_s)

    def register(self, tensor: torch.Tensor) -> list[int]:
        self._epoch += 1
        prefix = f"{self._key}/{self._epoch}"
        store = self._kv
        path = os.path.join(seg.SHM_DIR, seg.segment_name() + "-win")
        nbytes = tensor.numel() * tensor.element_size()
        store.set(f"{prefix}/{self._me}", json.dumps({"path": path, "numel": tensor.numel()}))
        infos = [json.loads(store.get(f"{prefix}/{r}")) for r in range(self._size)]
        mine = SignalFile(path, nbytes, self._size, create=True)
        try:
            shared = mine.data[:nbytes].view(tensor.dtype).view(tensor.shape)
            shared.copy_(tensor)
            tensor.set_(shared)  # type: ignore[call-overload]
            self._tensor = tensor
            self._waited = [0] * self._size
            self._b.barrier(False, timeout=self._timeout())  # every file exists
            es = tensor.element_size()
            self._files = [
                mine
                if r == self._me
                else SignalFile(info["path"], info["numel"] * es, self._size, create=False)
                for r, info in enumerate(infos)
            ]
            self._b.barrier(False, timeout=self._timeout())  # everyone mapped everyone
        finally:
            for info in infos:  # any rank removes any file: a SIGKILLed peer leaks nothing
                seg.unlink_quietly(os.path.basename(info["path"]))
        self._views = [
            f.data[: info["numel"] * tensor.element_size()].view(tensor.dtype)
            for f, info in zip(self._files, infos, strict=True)
        ]
        self._bases = [v.data_ptr() for v in self._views]
        return [info["numel"] for info in infos]

    def deregister(self) -> None:
        self._b.barrier(False, timeout=self._timeout())  # no peer still writes here
        self.free()

    def free(self, abort: bool = False) -> None:
        tensor = self._tensor
        if tensor is not None:
            tensor.set_(tensor.clone())  # type: ignore[call-overload]
        self._tensor = None
        self._views, self._bases = [], []
        for f in self._files:
            f.close()
        self._files = []

    def put(
        self, tensor: torch.Tensor, dst_rank: int, offset: int, async_op: bool, timeout: timedelta
    ) -> Any:
        size = tensor.element_size()
        ctypes.memmove(
            self._bases[dst_rank] + offset * size, tensor.data_ptr(), tensor.numel() * size
        )
        return None

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._files[peer_rank].words[self._me] += 1  # this rank is the only writer
        return None

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        self._waited[peer_rank] += 1
        seconds = timeout.total_seconds()
        return settle(_SignalWait(self, peer_rank, self._waited[peer_rank], seconds), async_op)

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        return TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED

    def map_remote(self, rank: int) -> torch.Tensor:
        return self._views[rank]


class _SignalWait:
    """Waits until ``peer``'s counter in this rank's file reaches ``target``."""

    def __init__(self, engine: ShmWindowEngine, peer: int, target: int, seconds: float) -> None:
        self._e, self._peer, self._target, self._seconds = engine, peer, target, seconds
        self._deadline = time.monotonic() + seconds

    def is_completed(self) -> bool:
        files = self._e._files
        return bool(files) and files[self._e._me].words[self._peer] >= self._target

    def wait(self) -> bool:
        e, st = self._e, self._e._st
        if not e._files:
            raise CommOperationError("wait_signal: the window was freed while waiting")
        words, peer, target = e._files[e._me].words, self._peer, self._target

        def alarm(final: bool) -> None:
            with st.lock:
                st.op, st.seconds = "wait_signal", self._seconds
                if final:
                    raise seg.timeout_error(
                        f"wait_signal (rank {e._me} waiting for a signal from rank {peer})",
                        self._seconds,
                        [peer],
                    )
                st.alarm(False)

        st.waiter.wait(lambda: words[peer] >= target, self._deadline, alarm)
        return True
