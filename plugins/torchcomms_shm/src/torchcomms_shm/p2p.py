"""``PointToPoint``: the shm backend's point-to-point part, one byte ring per ordered pair.

Each ordered pair of ranks has a ring in the segment (single writer, single reader) and
two counters: bytes written and bytes read. Sends and receives are queued per channel
(:meth:`PointToPoint.post`) and advanced by whoever waits (:meth:`PointToPoint.progress`;
the lockstep's alarm advances them too), so asynchronous sends never block on the
receiver. The backend's ``send``, ``recv``, ``batch_op_issue`` and their tagged and
any-source forms post and wait here.

Matching, as MPI matches: a message carries its tag, and a receive takes the first message
from its source (any source: from any rank) under its tag; among the receives a message
could go to, the one posted first takes it. A channel's next message is read once some
posted receive may want a message of that channel; if none of them matches it, it is
copied out of the ring into a buffer of its own (an unexpected message), so that the
messages behind it can reach their receives, and a later receive takes it from there. With
tag 0 and a given source everywhere, every message streams straight from the ring into its
receive, as before tags.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``copying``, ``lockstep`` and ``segment``.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch

from torchcomms_core.plugin import BatchOp, CommInputError, CommOperationError

from . import segment as seg
from .copying import as_u8, copy_to
from .lockstep import Lockstep

#: A message's header on the wire: its byte count and its tag.
_HEADER = struct.Struct("<qq")
HEADER = _HEADER.size


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
        #: Receives from any source, in the order they were posted.
        self._any_q: deque[_P2P] = deque()
        #: Per channel: the message being read out of the ring, into its receive or into a
        #: buffer of its own (an unexpected message).
        self._incoming: list[_P2P | None] = []
        #: Per channel: unexpected messages read whole, in the order they arrived.
        self._unexpected: list[deque[_P2P]] = []
        self._sent: list[int] = []
        self._got: list[int] = []
        #: Numbers receives in the order they were posted, and unexpected messages in the
        #: order they arrived.
        self._posted = 0
        self._arrived = 0
        #: Unexpected messages held now (over every channel).
        self._nunexpected = 0

    def reset(self) -> None:
        """Empty rings and queues for the segment the lockstep was just bound to."""
        n = self._st.size
        self._ring = self._st.layout.p2p_bytes
        self._send_q = [deque() for _ in range(n)]
        self._recv_q = [deque() for _ in range(n)]
        self._any_q = deque()
        self._incoming = [None] * n
        self._unexpected = [deque() for _ in range(n)]
        self._nunexpected = 0
        self._sent = [0] * n  # bytes this rank wrote into channel me -> p
        self._got = [0] * n  # bytes this rank read from channel p -> me
        self.npending = 0

    def post(self, ops: Sequence[BatchOp], tag: int = 0) -> list[_P2P]:
        """Queue ``ops`` (``(kind, tensor, peer)``, ``kind`` ``send`` or ``recv``; a receive
        from peer ``-1`` takes a message from any rank) under ``tag`` and move what can move
        now; the queued items, for :meth:`work`. Called under the lock.

        Raises:
            CommInputError: a send names this rank itself.
        """
        posted = []
        me = self._st.rank
        for kind, tensor, peer in ops:
            item = _P2P(kind == "send", as_u8(tensor), peer, tag)
            if item.send:
                if peer == me:
                    raise CommInputError(f"send to this rank itself ({peer}); pick another rank")
                self._send_q[peer].append(item)
            else:
                self._posted += 1
                item.order = self._posted
                if not (self._nunexpected and self._take_unexpected(item)):
                    (self._any_q if peer < 0 else self._recv_q[peer]).append(item)
            if item.done != item.wire:
                self.npending += 1
            posted.append(item)
        self.progress()
        return posted

    def work(self, items: list[_P2P], any_source: bool = False) -> _P2PWork:
        """The work that waits for ``items``, under the running operation's name and timeout
        (``any_source``: one receive from any source, whose work names the sender)."""
        st = self._st
        kind = AnySourceWork if any_source else _P2PWork
        return kind(st, self.progress, items, st.op, st.seconds)

    def advance(self) -> None:
        """Advance the queued operations if any wait and none is being advanced now (the
        lockstep's alarm calls this while it waits)."""
        if self.npending and not self._in_progress:
            self.progress()

    def progress(self) -> bool:
        """Advance the first queued send of every channel and what every channel brings in;
        ``True`` if anything moved."""
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
                if self._recv_q[p] or self._any_q or self._incoming[p] is not None:
                    moved = self._receive(p) or moved
            return moved
        finally:
            self._in_progress = False

    def _ring_base(self, src: int, dst: int) -> int:
        lay = self._st.layout
        return lay.rings + (src * self._st.size + dst) * lay.p2p_bytes

    def _push(self, item: _P2P) -> bool:
        """Write what fits of ``item`` into channel me -> peer; ``True`` once all is written.

        On the wire a message is a header of :data:`HEADER` bytes (its byte count and its
        tag), the bytes, and padding to a multiple of the header, so every header sits
        aligned and never wraps.
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
                if free < HEADER:
                    break
                _HEADER.pack_into(mapping.map, base + pos, item.total, item.tag)
                head += HEADER
                item.done = HEADER
                continue
            if free <= 0:
                break
            m = min(free, size - pos, item.wire - item.done)
            lo, hi = item.done - HEADER, min(item.done - HEADER + m, item.total)
            if hi > lo:
                copy_to(mapping.raw[base + pos : base + pos + hi - lo], item.data[lo:hi])
            head += m
            item.done += m
        if head != self._sent[p]:
            self._sent[p] = head
            w[lay.head_word(me, p)] = head
        return item.done == item.wire

    def _receive(self, p: int) -> bool:
        """Read channel p -> me: each message into the receive it matches, or out of the
        way while a posted receive waits behind it; ``True`` if anything moved."""
        st = self._st
        me, size = st.rank, self._ring
        w, lay = st.words, st.layout
        mapping = st.mapping
        assert mapping is not None
        head = w[lay.head_word(p, me)]
        tail = self._got[p]
        base = self._ring_base(p, me)
        moved = False
        while True:
            item = self._incoming[p]
            if item is None:
                if head - tail < HEADER or not (self._recv_q[p] or self._any_q):
                    break  # nothing has come, or nobody asks for this channel yet
                total, tag = _HEADER.unpack_from(mapping.map, base + tail % size)
                q = self._recv_q[p]
                if q and q[0].tag == tag and not self._any_q:
                    item = q.popleft()  # the common case: the first receive posted takes it
                else:
                    item = self._match(p, tag)
                if item is None:  # a posted receive waits behind it: read it out of the way
                    item = _P2P(False, torch.empty(total, dtype=torch.uint8), p, tag)
                    item.order = 0
                elif item.total != total:
                    raise st.fail(
                        CommInputError(
                            f"recv from rank {p} expects {item.total} bytes but rank {p} sent "
                            f"{total}; post receives of the sent size and dtype"
                        )
                    )
                item.peer = p
                self._incoming[p] = item
                tail += HEADER
                item.done = HEADER
                moved = True
            while item.done < item.wire:
                avail = head - tail
                if avail <= 0:
                    break
                pos = tail % size
                m = min(avail, size - pos, item.wire - item.done)
                lo, hi = item.done - HEADER, min(item.done - HEADER + m, item.total)
                if hi > lo:
                    copy_to(item.data[lo:hi], mapping.raw[base + pos : base + pos + hi - lo])
                tail += m
                item.done += m
                moved = True
            if item.done != item.wire:
                break
            self._incoming[p] = None
            if item.order:
                self.npending -= 1
                continue
            # Read out of the way: a receive posted while it was read may take it now.
            late = self._match(p, item.tag)
            if late is not None:
                self._deliver(item, late)
                self.npending -= 1
            else:
                self._arrived += 1
                item.order = -self._arrived
                self._unexpected[p].append(item)
                self._nunexpected += 1
        if tail != self._got[p]:
            self._got[p] = tail
            w[lay.tail_word(p, me)] = tail
        return moved

    def _match(self, p: int, tag: int) -> _P2P | None:
        """The posted receive a message from ``p`` under ``tag`` goes to (taken off its
        queue): the first posted of the first matching receive from ``p`` and the first
        matching receive from any source; ``None`` if neither matches."""
        mine = next((r for r in self._recv_q[p] if r.tag == tag), None)
        anyone = next((r for r in self._any_q if r.tag == tag), None)
        if anyone is not None and (mine is None or anyone.order < mine.order):
            self._any_q.remove(anyone)
            return anyone
        if mine is not None:
            self._recv_q[p].remove(mine)
        return mine

    def _take_unexpected(self, item: _P2P) -> bool:
        """Complete the receive ``item`` from an unexpected message it matches, the earliest
        arrived (from its source, or from any rank); ``False`` if none matches."""
        sources = range(self._st.size) if item.peer < 0 else (item.peer,)
        found: _P2P | None = None
        for p in sources:
            for msg in self._unexpected[p]:
                if msg.tag == item.tag:
                    if found is None or msg.order > found.order:  # arrival numbers are negated
                        found = msg
                    break
        if found is None:
            return False
        self._unexpected[found.peer].remove(found)
        self._nunexpected -= 1
        self._deliver(found, item)
        return True

    def _deliver(self, msg: _P2P, item: _P2P) -> None:
        """Complete the receive ``item`` with the unexpected message ``msg``."""
        p = msg.peer
        if msg.total != item.total:
            raise self._st.fail(
                CommInputError(
                    f"recv from rank {p} expects {item.total} bytes but rank {p} sent "
                    f"{msg.total}; post receives of the sent size and dtype"
                )
            )
        copy_to(item.data, msg.data)
        item.peer = p
        item.done = item.wire


class _P2P:
    """One queued send or receive: its bytes, its tag, and how many wire bytes moved
    (header, data, padding). ``peer`` is ``-1`` for a receive from any source until a
    message is matched to it; ``order`` numbers receives as posted (unexpected messages:
    the negated arrival number)."""

    __slots__ = ("send", "data", "peer", "tag", "done", "total", "wire", "order")

    def __init__(self, send: bool, data: torch.Tensor, peer: int, tag: int = 0) -> None:
        self.send, self.data, self.peer, self.tag = send, data, peer, tag
        self.done = 0
        self.order = 0
        self.total = data.numel()
        self.wire = HEADER + (self.total + HEADER - 1) // HEADER * HEADER


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
                peers = sorted({i.peer for i in self._items if i.done != i.wire and i.peer >= 0})
                raise st.fail(seg.timeout_error(self._what, self._seconds, peers))
            st.alarm(False)


class AnySourceWork(_P2PWork):
    """The work of a receive from any source: ``source_rank()`` names the sender once the
    receive completed."""

    def source_rank(self) -> int:
        item = self._items[0]
        if item.done != item.wire:
            raise RuntimeError(
                "recv from any source: the sender is known only once the receive completed; "
                "call wait() first"
            )
        return item.peer
