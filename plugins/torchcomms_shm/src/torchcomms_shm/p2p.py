"""``ShmP2P``: the shm backend's point-to-point engine, one byte ring per ordered pair.

Each ordered pair of ranks has a ring in the segment (single writer, single reader) and
two counters: bytes written and bytes read. Sends and receives are queued per channel
and advanced by whoever waits (:meth:`ShmP2P._progress`), so asynchronous sends never
block on the receiver. ``send``, ``recv`` and ``batch_op_issue`` themselves are
``ShmBackend``'s.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``comm`` and ``segment``.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from torchcomms_core.plugin import CommInputError, CommOperationError

from . import segment as seg
from .comm import ShmComm, _copy


class ShmP2P(ShmComm):
    """The rings and queues of point-to-point operations (see the module docstring)."""

    def _init_state(self) -> None:
        super()._init_state()
        n = self._size
        # Point to point: per channel a ring and its two counters, plus queued operations.
        self._ring = self._layout.p2p_bytes
        self._send_q: list[deque[_P2P]] = [deque() for _ in range(n)]
        self._recv_q: list[deque[_P2P]] = [deque() for _ in range(n)]
        self._sent = [0] * n  # bytes this rank wrote into channel me -> p
        self._got = [0] * n  # bytes this rank read from channel p -> me

    # -- point to point ---------------------------------------------------------------

    def _progress(self) -> bool:
        """Advance the first queued send and receive of every channel; ``True`` if any moved."""
        if self._mapping is None:
            return False
        self._in_progress = True
        try:
            moved = False
            for p in range(self._size):
                q = self._send_q[p]
                while q and self._push(q[0]):
                    q.popleft()
                    self._npending -= 1
                    moved = True
                q = self._recv_q[p]
                while q and self._pull(q[0]):
                    q.popleft()
                    self._npending -= 1
                    moved = True
            return moved
        finally:
            self._in_progress = False

    def _ring_base(self, src: int, dst: int) -> int:
        lay = self._layout
        return lay.rings + (src * self._size + dst) * lay.p2p_bytes

    def _push(self, item: _P2P) -> bool:
        """Write what fits of ``item`` into channel me -> peer; ``True`` once all is written.

        On the wire a message is an 8-byte header (its byte count), the bytes, and padding
        to a multiple of 8, so every header sits 8-aligned and never wraps.
        """
        me, p, size = self._rank, item.peer, self._ring
        w, lay = self._w, self._layout
        mapping = self._mapping
        assert mapping is not None
        tail = w[lay.tail_word(me, p)]
        head = self._sent[p]
        base = self._ring_base(me, p)
        while item.done < item.wire:
            free = size - (head - tail)
            pos = head % size
            if item.done == 0:
                if free < 8:
                    break
                mapping.map[base + pos : base + pos + 8] = item.total.to_bytes(8, "little")
                head += 8
                item.done = 8
                continue
            if free <= 0:
                break
            m = min(free, size - pos, item.wire - item.done)
            lo, hi = item.done - 8, min(item.done - 8 + m, item.total)
            if hi > lo:
                _copy(mapping.raw[base + pos : base + pos + hi - lo], item.data[lo:hi])
            head += m
            item.done += m
        if head != self._sent[p]:
            self._sent[p] = head
            w[lay.head_word(me, p)] = head
        return item.done == item.wire

    def _pull(self, item: _P2P) -> bool:
        """Read what has arrived of ``item`` from channel peer -> me; ``True`` once complete."""
        me, p, size = self._rank, item.peer, self._ring
        w, lay = self._w, self._layout
        mapping = self._mapping
        assert mapping is not None
        head = w[lay.head_word(p, me)]
        tail = self._got[p]
        base = self._ring_base(p, me)
        while item.done < item.wire:
            avail = head - tail
            if avail <= 0:
                break
            pos = tail % size
            if item.done == 0:  # a header is written whole before the head moves past it
                sent = int.from_bytes(mapping.map[base + pos : base + pos + 8], "little")
                if sent != item.total:
                    raise self._fail(
                        CommInputError(
                            f"recv from rank {p} expects {item.total} bytes but rank {p} sent "
                            f"{sent}; post receives of the sent size and dtype"
                        )
                    )
                tail += 8
                item.done = 8
                continue
            m = min(avail, size - pos, item.wire - item.done)
            lo, hi = item.done - 8, min(item.done - 8 + m, item.total)
            if hi > lo:
                _copy(item.data[lo:hi], mapping.raw[base + pos : base + pos + hi - lo])
            tail += m
            item.done += m
        if tail != self._got[p]:
            self._got[p] = tail
            w[lay.tail_word(p, me)] = tail
        return item.done == item.wire


class _P2P:
    """One queued send or receive: its bytes, and how many wire bytes moved (header, data,
    padding to 8)."""

    __slots__ = ("send", "data", "peer", "done", "total", "wire")

    def __init__(self, send: bool, data: torch.Tensor, peer: int) -> None:
        self.send, self.data, self.peer = send, data, peer
        self.done = 0
        self.total = data.numel()
        self.wire = 8 + (self.total + 7) // 8 * 8


class _P2PWork:
    """Waits for a set of queued sends and receives, advancing every channel meanwhile."""

    def __init__(self, backend: ShmP2P, items: list[_P2P], what: str, seconds: float) -> None:
        self._b, self._items, self._what, self._seconds = backend, items, what, seconds
        self._deadline = time.monotonic() + seconds

    def is_completed(self) -> bool:
        if all(i.done == i.wire for i in self._items):
            return True
        b = self._b
        if b._lock.acquire(blocking=False):
            try:
                if b._mapping is not None and b._broken is None and not b._aborted:
                    b._progress()
            finally:
                b._lock.release()
        return all(i.done == i.wire for i in self._items)

    def wait(self) -> bool:
        b, items = self._b, self._items

        def ready() -> bool:
            if all(i.done == i.wire for i in items):
                return True
            with b._lock:
                if b._aborted or b._mapping is None:
                    return True  # the alarm below reports it
                b._progress()
            return all(i.done == i.wire for i in items)

        if ready():
            return True
        with b._lock:
            b._op, b._seconds, b._deadline = self._what, self._seconds, self._deadline
        b._waiter.wait(ready, self._deadline, self._alarm)
        if b._aborted or b._mapping is None:
            raise CommOperationError(f"{self._what}: the communicator was aborted while waiting")
        return True

    def _alarm(self, final: bool) -> None:
        b = self._b
        with b._lock:
            b._op, b._seconds = self._what, self._seconds
            if final:
                peers = sorted({i.peer for i in self._items if i.done != i.wire})
                raise b._fail(seg.timeout_error(self._what, self._seconds, peers))
            b._alarm(False)
