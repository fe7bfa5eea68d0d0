"""Gloo windows between ranks that share no memory, on the installed transport.

Each rank registers its window tensor in place and an ``int64`` counter per peer, and
connects one ``RdmaTransport`` to every other rank (addresses and remote buffers travel
through the communicator's store). ``put`` is a one-sided write into the peer's tensor.
Writes block until done at the target, so whatever follows a put arrives after its data:

- on a transport that carries signals (``RdmaTransport.signal``, NIXL's notifications),
  ``signal`` is one such message and ``wait_signal`` polls the transport's count, which
  lets the engine take in what arrived on every poll. A put of up to
  ``RdmaTransport.max_post_bytes()`` (and ``POST_BYTES``) is a posted write: its bytes
  travel in a message the peer copies in, ahead of the signal that follows (a window's
  contract is that ``signal`` makes the earlier puts visible). The put and its signal then
  take one trip, where a write waits for the peer's acknowledgement first. Before a larger
  put to a peer with posted ones outstanding, and before deregistering, the posted ones
  are flushed, so puts land in the order they were made;
- otherwise ``signal`` writes this rank's running count into its slot of the peer's
  counters and ``wait_signal`` polls the local counters, as on shared memory.
"""

from __future__ import annotations

import base64
import collections
import json
from datetime import timedelta
from typing import Any, Protocol

import torch

from torchcomms_core.plugin import (
    CommOptions,
    RdmaMemory,
    RdmaRemoteBuffer,
    RdmaTransport,
    WindowPeers,
    read_record,
)

#: Source tensors of ``put`` kept registered (and alive) for reuse, most recent first.
SOURCE_CACHE = 4
#: Puts up to this many bytes are posted writes where the transport carries them.
POST_BYTES = 64 << 10


#: The fields of a rank's window record (read_record checks their types).
_RECORD = {"numel": int, "data": list, "counters": list, "urls": dict}


def _remote(values: list[Any]) -> RdmaRemoteBuffer:
    return RdmaRemoteBuffer(int(values[0]), int(values[1]), str(values[2]))


def _described(buffer: RdmaRemoteBuffer) -> list[Any]:
    return [buffer.ptr, buffer.len, buffer.access_key]


class WindowHost(WindowPeers, Protocol):
    """What a gloo window uses of its backend (``GlooBackend`` is one): rank, size, barrier,
    and the options holding its store and default timeout."""

    @property
    def options(self) -> CommOptions:
        """The communicator's options (its store and default timeout)."""
        ...


class _SignalCounts:
    """The signal counts ``wait_signal`` polls, as the transports count them: reading one
    lets the transport take in what arrived (see ``RdmaTransport.signals``)."""

    __slots__ = ("_transports", "_own")

    def __init__(self, transports: dict[int, RdmaTransport], rank: int) -> None:
        self._transports = transports
        self._own = {rank: 0}  # this rank's signals to itself

    def __getitem__(self, peer: int) -> int:
        own = self._own.get(peer)
        return self._transports[peer].signals() if own is None else own

    def __setitem__(self, peer: int, value: int) -> None:
        self._own[peer] = value


class TransportWindow:
    """One registration of a gloo window whose peers are reached through the transport."""

    def __init__(self, backend: WindowHost, prefix: str, timeout: timedelta) -> None:
        self._store = backend.options.store
        self._rank = backend.get_rank()
        self._size = backend.get_size()
        self._prefix = f"{prefix}/transport"
        self._timeout = timeout
        self._backend = backend
        self._tensor: torch.Tensor | None = None
        self._transports: dict[int, RdmaTransport] = {}
        self._memories: list[RdmaMemory] = []
        self._data: list[RdmaRemoteBuffer | None] = []
        self._slots: list[RdmaRemoteBuffer | None] = []  # this rank's counter slot at each peer
        self._sent = [0] * self._size
        self._sources: collections.OrderedDict[tuple[int, int], RdmaMemory] = (
            collections.OrderedDict()
        )
        #: Signal counts received from each rank (what ``wait_signal`` polls).
        self.counters: memoryview | _SignalCounts = memoryview(b"")
        #: Whether signals travel as the transport's own messages (see the module docstring).
        self.messages = False
        #: The largest put sent as a posted write (0: none), and the peers with posted
        #: writes not flushed yet.
        self._post_limit = 0
        self._posted: set[int] = set()

    def register(self, tensor: torch.Tensor) -> list[int]:
        rank, size = self._rank, self._size
        self._tensor = tensor
        self._counter_tensor = torch.zeros(size, dtype=torch.int64)
        self._outbox = torch.zeros(size, dtype=torch.int64)
        data = RdmaMemory(tensor)
        counters = RdmaMemory(self._counter_tensor)
        self._outbox_memory = RdmaMemory(self._outbox)
        self._memories = [data, counters, self._outbox_memory]
        self.counters = self._counter_tensor.numpy().data.cast("B").cast("q")
        self._transports = {
            peer: RdmaTransport(torch.device("cpu"), timeout=self._timeout)
            for peer in range(size)
            if peer != rank
        }
        mine = {
            "numel": tensor.numel(),
            "data": _described(data.to_remote_buffer()),
            "counters": _described(counters.to_remote_buffer()),
            "urls": {
                str(peer): base64.b64encode(t.bind()).decode("ascii")
                for peer, t in self._transports.items()
            },
        }
        self._store.set(f"{self._prefix}/{rank}", json.dumps(mine))
        everyone = [
            read_record(self._store.get(f"{self._prefix}/{r}"), f"{self._prefix}/{r}", _RECORD)
            for r in range(size)
        ]
        # In ascending peer order on every rank, so each pair's connects meet without a cycle.
        for peer in sorted(self._transports):
            url = base64.b64decode(everyone[peer]["urls"][str(rank)])
            self._transports[peer].connect(url)
        self._data = [
            None if r == rank else _remote(info["data"]) for r, info in enumerate(everyone)
        ]
        element = 8  # int64 counters
        self._slots = [
            None
            if r == rank
            else RdmaRemoteBuffer(
                int(info["counters"][0]) + rank * element, element, str(info["counters"][2])
            )
            for r, info in enumerate(everyone)
        ]
        self._sent = [0] * size
        self.messages = all(t.supports_signals() for t in self._transports.values())
        if self.messages:
            self.counters = _SignalCounts(self._transports, rank)
            limits = [t.max_post_bytes() for t in self._transports.values()]
            self._post_limit = min([POST_BYTES, *limits])
        self._posted = set()
        return [int(info["numel"]) for info in everyone]

    def put(self, tensor: torch.Tensor, dst: int, offset: int, timeout: timedelta) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            return
        if dst == self._rank:
            target = self._tensor
            assert target is not None
            target.view(-1)[offset : offset + tensor.numel()].copy_(tensor.view(-1))
            return
        base = self._data[dst]
        assert base is not None
        remote = RdmaRemoteBuffer(
            base.ptr + offset * tensor.element_size(), nbytes, base.access_key
        )
        transport = self._transports[dst]
        if nbytes <= self._post_limit:
            transport.post_write(tensor, remote, timeout=timeout)
            self._posted.add(dst)
            return
        if dst in self._posted:  # the posted puts before this one land first
            transport.flush(timeout=timeout)
            self._posted.discard(dst)
        transport.write(self._source(tensor).to_view(), remote, timeout=timeout)

    def signal(self, peer: int, timeout: timedelta) -> None:
        self._sent[peer] += 1
        if peer == self._rank:
            self.counters[peer] = self._sent[peer]
            return
        if self.messages:
            self._transports[peer].signal(timeout=timeout)
            return
        slot = self._slots[peer]
        assert slot is not None
        self._outbox[peer] = self._sent[peer]
        view = self._outbox_memory.to_view(peer * 8, 8)
        self._transports[peer].write(view, slot, timeout=timeout)

    def _source(self, tensor: torch.Tensor) -> RdmaMemory:
        """``tensor`` registered: from the cache when it was put recently."""
        key = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        found = self._sources.get(key)
        if found is not None:
            try:
                found.to_view()  # still the tensor's memory (not resized or replaced)
            except Exception:
                del self._sources[key]
            else:
                self._sources.move_to_end(key)
                return found
        memory = RdmaMemory(tensor)
        self._sources[key] = memory
        while len(self._sources) > SOURCE_CACHE:
            self._sources.popitem(last=False)
        return memory

    def deregister(self, timeout: timedelta) -> None:
        for peer in sorted(self._posted):  # puts never signalled land too, as on shared memory
            self._transports[peer].flush(timeout=timeout)
        self._posted = set()
        self._backend.barrier(False, timeout=timeout)  # no peer still writes to this rank
        self.free()

    def free(self, abort: bool = False) -> None:
        self.counters = memoryview(b"")
        if not abort:
            # Closing waits until every peer confirmed it can no longer reach the memory.
            for memory in self._memories:
                memory.close()
        self._memories = []
        self._posted = set()
        self._sources.clear()
        for transport in self._transports.values():
            transport.close()
        self._transports = {}
        self._data, self._slots = [], []
        self._tensor = None
