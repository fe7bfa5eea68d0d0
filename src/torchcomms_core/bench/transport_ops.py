"""``transport_write`` and ``transport_read``: one-sided transfers between ranks 0 and 1 through
the installed transport (``RdmaTransport``), timed like send_recv.

A timed call is a round trip of two legs. ``transport_write``: rank 0 writes its input into
rank 1's output and writes an 8-byte flag after it; rank 1 waits for the flag, writes its
output back into rank 0's and raises rank 0's flag. ``transport_read``: rank 1 reads rank
0's input into its output and raises the flag; rank 0 then reads rank 1's output into its
own. The reported time is one leg: a transfer plus the flag that orders it (at large sizes,
the transfer). The flag is needed because the target takes no part in a one-sided
transfer, so nothing else tells it the data is there. It is the transport's own signal
(``RdmaTransport.signal``) where the transport carries signals, else an 8-byte write into a
counter the peer polls.
"""

from __future__ import annotations

import os
import pickle
import time
from typing import Any

import torch

from torchcomms_core.bench.base import PairOp
from torchcomms_core.bench.data import Buffers, Case
from torchcomms_core.comm.transport import RdmaMemory, RdmaRemoteBuffer, RdmaTransport
from torchcomms_core.foundation.errors import CommTimeoutError

#: Seconds a leg may wait for the peer's flag.
FLAG_TIMEOUT_S = 120.0
#: Seconds a wait polls flat out (yielding the CPU) before it naps between polls, as the
#: shared-memory window's wait_signal does.
_BUSY_S = 2.0


#: A rank's registered input and output, and the peer's: ``(in, out, peer_in, peer_out)``.
_Memories = tuple[RdmaMemory, RdmaMemory, RdmaRemoteBuffer, RdmaRemoteBuffer]


def _send_recv(comm: Any, rank: int, out: torch.Tensor, into: torch.Tensor) -> None:
    """Ranks 0 and 1 send ``out`` to each other and receive into ``into``, rank 0 first."""
    peer = 1 - rank
    if rank == 0:
        comm.send(out, peer)
        comm.recv(into, peer)
    else:
        comm.recv(into, peer)
        comm.send(out, peer)


def _swap(comm: Any, rank: int, payload: bytes) -> bytes:
    """Ranks 0 and 1 exchange ``payload`` over the communicator."""
    mine = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    theirs_size = torch.empty(1, dtype=torch.int64)
    _send_recv(comm, rank, torch.tensor([mine.numel()], dtype=torch.int64), theirs_size)
    theirs = torch.empty(int(theirs_size), dtype=torch.uint8)
    _send_recv(comm, rank, mine, theirs)
    return theirs.numpy().tobytes()


class _Link:
    """Rank 0's or 1's connected transport and the flags that order the legs."""

    def __init__(self, comm: Any, rank: int) -> None:
        self.comm = comm
        self.transport = RdmaTransport(comm.get_device())
        self.transport.connect(_swap(comm, rank, self.transport.bind()))
        self.flag = torch.zeros(1, dtype=torch.int64)
        self.outgoing = torch.zeros(1, dtype=torch.int64)
        self.flag_memory = RdmaMemory(self.flag)
        self.out_memory = RdmaMemory(self.outgoing)
        self.peer_flag: RdmaRemoteBuffer = pickle.loads(
            _swap(comm, rank, pickle.dumps(self.flag_memory.to_remote_buffer()))
        )
        self.words = self.flag.numpy().data.cast("B").cast("q")
        self.messages = self.transport.supports_signals()
        self.sent = 0
        self.seen = 0
        #: The registered buffers of the current size and the peer's, keyed by our output.
        self.buffers: (
            tuple[torch.Tensor, RdmaMemory, RdmaMemory, RdmaRemoteBuffer, RdmaRemoteBuffer] | None
        ) = None

    def signal(self) -> None:
        self.sent += 1
        if self.messages:
            self.transport.signal()
            return
        self.outgoing[0] = self.sent
        self.transport.write(self.out_memory.to_view(), self.peer_flag)

    def wait(self) -> None:
        self.seen += 1
        words, target = self.words, self.seen
        signals = self.transport.signals if self.messages else None
        start = time.monotonic()
        while True:
            for _ in range(1000):  # a flag lands within microseconds of the peer's write
                if (words[0] if signals is None else signals()) >= target:
                    return
            os.sched_yield()  # let the peer run on a machine with more ranks than cores
            waited = time.monotonic() - start
            if waited > FLAG_TIMEOUT_S:
                raise CommTimeoutError(
                    f"transport bench: no flag from the peer within {FLAG_TIMEOUT_S:g} s"
                )
            if waited > _BUSY_S:
                time.sleep(0.0002)

    def registered(self, bufs: Buffers, rank: int) -> _Memories:
        """``(input, output, peer's input, peer's output)``, registered once per size."""
        if self.buffers is not None and self.buffers[0] is bufs.output:
            return self.buffers[1:]
        if self.buffers is not None:
            self.buffers[1].close()
            self.buffers[2].close()
        m_in, m_out = RdmaMemory(bufs.input), RdmaMemory(bufs.output)
        mine = (m_in.to_remote_buffer(), m_out.to_remote_buffer())
        peer_in, peer_out = pickle.loads(_swap(self.comm, rank, pickle.dumps(mine)))
        self.buffers = (bufs.output, m_in, m_out, peer_in, peer_out)
        return m_in, m_out, peer_in, peer_out


class _TransportOp(PairOp):
    """What both transport operations share: the link per communicator, the first-call
    handshake after ``fill`` (the target's output must be cleared before it is written)."""

    c10d_name = None
    #: The rank whose leg comes first in a round trip; the other tells it, on the first
    #: call after ``fill``, that its buffers are ready.
    first = 0

    def __init__(self) -> None:
        self._links: dict[int, tuple[Any, _Link]] = {}
        self._fresh = False

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if not RdmaTransport.supported():
            return "needs a transport plugin (pip install torchcomms-nixl)"
        return super().refuses(dtype, redop, nranks)

    def fill(self, bufs: Buffers, case: Case) -> None:
        super().fill(bufs, case)
        self._fresh = True

    def _link(self, comm: Any, rank: int) -> _Link:
        found = self._links.get(id(comm))
        if found is not None and found[0] is comm:
            return found[1]
        link = _Link(comm, rank)
        self._links = {id(comm): (comm, link)}
        return link

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        if case.rank > 1:
            return
        link = self._link(comm, case.rank)
        memories = link.registered(bufs, case.rank)
        if self._fresh:
            self._fresh = False
            if case.rank == self.first:
                link.wait()
            else:
                link.signal()
        if case.rank == self.first:
            self._leg(link, case.rank, memories)
            link.signal()
            link.wait()
        else:
            link.wait()
            self._leg(link, case.rank, memories)
            link.signal()

    def _leg(self, link: _Link, rank: int, memories: _Memories) -> None:
        """Rank ``rank``'s transfer of the round trip, between ``memories``: its input and
        output, and the peer's (as :meth:`_Link.registered` gives them)."""
        raise NotImplementedError


class TransportWrite(_TransportOp):
    """``RdmaTransport.write`` of the buffer, then an 8-byte flag; a leg per direction."""

    name = "transport_write"
    first = 0

    def _leg(self, link: _Link, rank: int, memories: _Memories) -> None:
        # Rank 0 writes its input into rank 1's output; rank 1 writes that back.
        m_in, m_out, _peer_in, peer_out = memories
        link.transport.write((m_in if rank == 0 else m_out).to_view(), peer_out)


class TransportRead(_TransportOp):
    """``RdmaTransport.read`` of the peer's buffer, then an 8-byte flag; a leg per direction."""

    name = "transport_read"
    first = 1

    def _leg(self, link: _Link, rank: int, memories: _Memories) -> None:
        # Rank 1 reads rank 0's input into its output; rank 0 reads that back.
        _m_in, m_out, peer_in, peer_out = memories
        link.transport.read(m_out.to_mutable_view(), peer_in if rank == 1 else peer_out)


__all__ = ["TransportRead", "TransportWrite"]
