"""``PointToPoint``: the shm backend's point-to-point part, one byte ring per ordered pair.

Each ordered pair of ranks has a ring in the segment (single writer, single reader) and
two counters: bytes written and bytes read. Sends and receives are queued per channel
(:meth:`PointToPoint.post`) and advanced by whoever waits (:meth:`PointToPoint.progress`;
the lockstep's alarm advances them too), so asynchronous sends never block on the
receiver. The backend's ``send``, ``recv`` and ``batch_op_issue`` post and wait here.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``copying``, ``lockstep`` and ``segment``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from torchcomms_core.plugin import BatchOp, CommInputError, CommOperationError

from . import segment as seg
from .copying import as_u8, copy_to
from .lockstep import Lockstep


class PointToPoint:
    """The rings and queues of point-to-point operations (see the module docstring)."""

    def __init__(self, state: Lockstep) -> None:
        self._st = state
        #: Operations queued and not complete, and whether they are being advanced now.
        self.npending = 0
        self._in_progress = False
        self._ring = 0
        self._send_q: list[deque[_P2P]] = []
        self._recv_q: list[deque[_P2P]] = []
        self._sent: list[int] = []
        self._got: list[int] = []

    def reset(self) -> None:
        """Empty rings and queues for the segment the lockstep was just bound to."""
        n = self._st.size
        self._ring = self._st.layout.p2p_bytes
        self._send_q = [deque() for _ in range(n)]
        self._recv_q = [deque() for _ in range(n)]
        self._sent = [0] * n  # bytes this rank wrote into channel me -> p
        self._got = [0] * n  # bytes this rank read from channel p -> me
        self.npending = 0

    def post(self, ops: Sequence[BatchOp]) -> list[_P2P]:
        """Queue ``ops`` (``(kind, tensor, peer)``, ``kind`` ``send`` or ``recv``) and move
        what can move now; the queued items, for :meth:`work`. Called under the lock.

        Raises:
            CommInputError: a send names this rank itself.
        """
        posted = []
        me = self._st.rank
        for kind, tensor, peer in ops:
            item = _P2P(kind == "send", as_u8(tensor), peer)
            if item.send and peer == me:
                raise CommInputError(f"send to this rank itself ({peer}); pick another rank")
            (self._send_q if item.send else self._recv_q)[peer].append(item)
            self.npending += 1
            posted.append(item)
        self.progress()
        return posted

    def work(self, items: list[_P2P]) -> _P2PWork:
        """The work that waits for ``items``, under the running operation's name and timeout."""
        st = self._st
        return _P2PWork(st, self.progress, items, st.op, st.seconds)

    def advance(self) -> None:
        """Advance the queued operations if any wait and none is being advanced now (the
        lockstep's alarm calls this while it waits)."""
        if self.npending and not self._in_progress:
            self.progress()

    def progress(self) -> bool:
        """Advance the first queued send and receive of every channel; ``True`` if any moved."""
        if self._st.mapping is None:
            return False
        self._in_progress = True
        try:
            moved = False
            for p in range(self._st.size):
                q = self._send_q[p]
                while q and self._push(q[0]):
                    q.popleft()
                    self.npending -= 1
                    moved = True
                q = self._recv_q[p]
                while q and self._pull(q[0]):
                    q.popleft()
                    self.npending -= 1
                    moved = True
            return moved
        finally:
            self._in_progress = False

    def _ring_base(self, src: int, dst: int) -> int:
        lay = self._st.layout
        return lay.rings + (src * self._st.size + dst) * lay.p2p_bytes

    def _push(self, item: _P2P) -> bool:
        """Write what fits of ``item`` into channel me -> peer; ``True`` once all is written.

        On the wire a message is an 8-byte header (its byte count), the bytes, and padding
        to a multiple of 8, so every header sits 8-aligned and never wraps.
        """
        st = self._st
        me, p, size = st.rank, item.peer, self._ring
        w, lay = st.words, st.layout
        mapping = st.mapping
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
                copy_to(mapping.raw[base + pos : base + pos + hi - lo], item.data[lo:hi])
            head += m
            item.done += m
        if head != self._sent[p]:
            self._sent[p] = head
            w[lay.head_word(me, p)] = head
        return item.done == item.wire

    def _pull(self, item: _P2P) -> bool:
        """Read what has arrived of ``item`` from channel peer -> me; ``True`` once complete."""
        st = self._st
        me, p, size = st.rank, item.peer, self._ring
        w, lay = st.words, st.layout
        mapping = st.mapping
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
                    raise st.fail(
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
                copy_to(item.data[lo:hi], mapping.raw[base + pos : base + pos + hi - lo])
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
    """Waits for a set of queued sends and receives, advancing every channel meanwhile
    (``progress``: :meth:`PointToPoint.progress`)."""

    def __init__(
        self,
        state: Lockstep,
        progress: Callable[[], bool],
        items: list[_P2P],
        what: str,
        seconds: float,
    ) -> None:
        self._st, self._progress, self._items = state, progress, items
        self._what, self._seconds = what, seconds
        self._deadline = time.monotonic() + seconds

    def is_completed(self) -> bool:
        if all(i.done == i.wire for i in self._items):
            return True
        st = self._st
        lock = st.lock
        if lock.acquire(blocking=False):
            try:
                if st.mapping is not None and st.broken is None and not st.aborted:
                    self._progress()
            finally:
                lock.release()
        return all(i.done == i.wire for i in self._items)

    def wait(self) -> bool:
        st, items, progress = self._st, self._items, self._progress

        def ready() -> bool:
            if all(i.done == i.wire for i in items):
                return True
            with st.lock:
                if st.aborted or st.mapping is None:
                    return True  # the alarm below reports it
                progress()
            return all(i.done == i.wire for i in items)

        if ready():
            return True
        with st.lock:
            st.op, st.seconds, st.deadline = self._what, self._seconds, self._deadline
        st.waiter.wait(ready, self._deadline, self._alarm)
        if st.aborted or st.mapping is None:
            raise CommOperationError(f"{self._what}: the communicator was aborted while waiting")
        return True

    def _alarm(self, final: bool) -> None:
        st = self._st
        with st.lock:
            st.op, st.seconds = self._what, self._seconds
            if final:
                peers = sorted({i.peer for i in self._items if i.done != i.wire})
                raise st.fail(seg.timeout_error(self._what, self._seconds, peers))
            st.alarm(False)
