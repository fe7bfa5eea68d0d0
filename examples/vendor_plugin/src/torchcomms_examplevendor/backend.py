"""``ExampleVendorBackend``: the spec's required primitives and nothing else.

Messages travel through the communicator's store, one key per message; everything
beyond send/recv comes from the core's portable defaults.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import CommOptions, TorchCommBackend

#: Largest value the store is given at once (c10d's TCPStore refuses more than 8 MiB).
PART_BYTES = 4 << 20


class _PendingRecv:
    """A receive that completes when the peer's message is in the store."""

    def __init__(
        self, backend: ExampleVendorBackend, tensor: torch.Tensor, key: str, timeout: timedelta
    ) -> None:
        self._backend, self._tensor, self._key, self._timeout = backend, tensor, key, timeout
        self._done = False

    def wait(self) -> bool:
        if not self._done:
            self._backend._take(self._key, self._tensor, self._timeout)
            self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done or self._backend._store.check([self._key])


class ExampleVendorBackend(TorchCommBackend):
    """Point-to-point over a c10d store: send writes a key, recv waits for it."""

    devices = ("cpu",)

    def __init__(self) -> None:
        self._store: Any = None
        self._rank = -1
        self._size = -1
        # Per-peer message counters: the n-th send to a peer matches its n-th receive.
        self._sent: defaultdict[int, int] = defaultdict(int)
        self._received: defaultdict[int, int] = defaultdict(int)

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        self._store = options.store
        self._rank, self._size = options.rank, options.size
        self._timeout = options.timeout or timedelta(seconds=600)

    def finalize(self) -> None:
        self._store = None

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_backend_name(self) -> str:
        return "examplevendor"

    def get_comm_name(self) -> str:
        return self.comm_name

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        seq = self._sent[dst]
        self._sent[dst] = seq + 1
        nbytes = tensor.numel() * tensor.element_size()
        key = f"msg/{self._rank}->{dst}/{seq}"
        # The store refuses values over 8 MiB: large messages travel in parts, and the
        # message's own key (its size) is written last, once every part is there.
        for part, start in enumerate(range(0, nbytes, PART_BYTES)):
            size = min(PART_BYTES, nbytes - start)
            self._store.set(f"{key}/{part}", ctypes.string_at(tensor.data_ptr() + start, size))
        self._store.set(key, str(nbytes))
        return None  # the store holds the message: the send is complete

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        seq = self._received[src]
        self._received[src] = seq + 1
        pending = _PendingRecv(
            self, tensor, f"msg/{src}->{self._rank}/{seq}", timeout or self._timeout
        )
        if async_op:
            return pending
        pending.wait()
        return None

    def _take(self, key: str, tensor: torch.Tensor, timeout: timedelta) -> None:
        self._store.wait([key], timeout)
        nbytes = int(self._store.get(key))
        self._store.delete_key(key)
        expected = tensor.numel() * tensor.element_size()
        if nbytes != expected:
            raise RuntimeError(
                f"examplevendor: received {nbytes} bytes into a buffer "
                f"of {expected}; the ranks called mismatched operations"
            )
        for part, start in enumerate(range(0, nbytes, PART_BYTES)):
            payload = self._store.get(f"{key}/{part}")
            self._store.delete_key(f"{key}/{part}")
            ctypes.memmove(tensor.data_ptr() + start, payload, len(payload))
