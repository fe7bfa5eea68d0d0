"""All-gather and reduce-scatter for Gloo built from pairwise transfers instead of its own.

Gloo's all-gather and reduce-scatter stage data through extra buffers (its reduce-scatter
costs more than an all-reduce), while its point-to-point transfers run at the speed of its
all-to-all. Above a crossover size, every rank posts one receive from and one send to each
peer at once, straight from the input views into the output views (no staging copy); a
reduce-scatter then reduces the received chunks locally, in a fixed order, one piece at a
time as they arrive, so the reduction overlaps the transfers still in flight. Below the
crossover, per-message costs dominate and the engine's own collectives are faster.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import ELEMENTWISE_REDUCE, RedOpType, ReduceOp

#: Point-to-point tag of these transfers, far from the small tags users pick, so a user's
#: ``send``/``recv`` on the same communicator never matches one of them. Both sides post
#: in the same collective order, so concurrent collectives pair up correctly.
TAG = 0x7C0A_11E5

#: Output bytes (all-gather) and input bytes (reduce-scatter) from which the pairwise
#: paths are used: below them per-message costs dominate and the engine's own collectives
#: are as fast. Measured with ``torchcomms bench --compare c10d`` (docs/benchmarks.md).
ALL_GATHER_MIN_BYTES = 8 << 20
REDUCE_SCATTER_MIN_BYTES = 4 << 20

#: Bytes per piece a reduce-scatter message is cut into, so reducing one piece overlaps
#: receiving the next; large enough that the per-message cost stays small.
PIECE_BYTES = 4 << 20

#: Element-wise reductions by kind; those missing (and bool tensors) use the engine.
_REDUCE = ELEMENTWISE_REDUCE


class PairwiseWork:
    """Waits for every transfer of a pairwise collective, then runs its local finish."""

    __slots__ = ("_works", "_waited", "_timeout", "_finish", "_done")

    def __init__(
        self,
        works: list[Any],
        timeout: timedelta | None,
        finish: Callable[[Callable[[int], None]], None] | None,
    ) -> None:
        self._works = works
        self._waited = [False] * len(works)
        self._timeout = timeout
        self._finish = finish
        self._done = False

    def _wait_one(self, index: int) -> None:
        # A Gloo receive must be waited on once only: a second wait expects a second message.
        if self._waited[index]:
            return
        self._waited[index] = True
        work = self._works[index]
        if self._timeout is None:
            work.wait()
        else:
            work.wait(self._timeout)

    def wait(self) -> bool:
        if self._done:
            return True
        finish, self._finish = self._finish, None
        if finish is not None:
            # The finish step waits for each transfer right before it needs it.
            finish(self._wait_one)
        for i in range(len(self._works)):
            self._wait_one(i)
        self._done = True
        return True

    def is_completed(self) -> bool:
        return self._done


class ScratchPool:
    """Receive buffers reused across calls: fresh large tensors cost page faults every time.

    A buffer is lent for one collective and returned when it completes, so collectives in
    flight together never share one.
    """

    __slots__ = ("_free",)

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        for i, buf in enumerate(self._free):
            if buf.numel() >= nbytes:
                del self._free[i]
                return buf
        return torch.empty(max(nbytes, 1), dtype=torch.uint8)

    def give(self, buf: torch.Tensor) -> None:
        # Keep the largest few; one per collective in flight is the common need.
        self._free.append(buf)
        self._free.sort(key=torch.Tensor.numel, reverse=True)
        del self._free[2:]

    @staticmethod
    def view(buf: torch.Tensor, numel: int, dtype: torch.dtype) -> torch.Tensor:
        itemsize = torch.empty((), dtype=dtype).element_size()
        return buf[: numel * itemsize].view(dtype)


def reduces_natively(op: ReduceOp, dtype: torch.dtype) -> bool:
    """Whether the pairwise reduce-scatter can apply ``op`` to ``dtype`` exactly like Gloo."""
    if dtype == torch.bool or op.type not in _REDUCE:
        return False
    if op.type in (RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR):
        return not dtype.is_floating_point
    return True


def all_gather(
    engine: Any,
    rank: int,
    size: int,
    outputs: Sequence[torch.Tensor],
    input: torch.Tensor,
    timeout: timedelta | None,
) -> PairwiseWork:
    """Gather ``input`` of every rank into ``outputs[rank]`` (flat contiguous views)."""
    works = []
    for step in range(1, size):
        src = (rank - step) % size
        works.append(engine.recv([outputs[src]], src, TAG))
    for step in range(1, size):
        works.append(engine.send([input], (rank + step) % size, TAG))
    mine = outputs[rank]
    if mine.data_ptr() != input.data_ptr():
        mine.copy_(input)  # overlaps the transfers just posted
    return PairwiseWork(works, timeout, None)


def reduce_scatter(
    engine: Any,
    rank: int,
    size: int,
    output: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    op: ReduceOp,
    timeout: timedelta | None,
    scratch: ScratchPool,
    piece_bytes: int = PIECE_BYTES,
) -> PairwiseWork:
    """Reduce chunk ``rank`` of every rank's ``inputs`` into ``output`` (flat views).

    Each rank's chunk goes in messages of ``piece_bytes`` (the tuner's parameter); the
    reduction adds, piece by piece, this rank's own chunk and then the chunks of ranks
    ``rank - 1``, ``rank - 2``, ... in that fixed order.
    """
    count = output.numel()
    dtype = output.dtype
    reduce = _REDUCE[op.type]
    if size == 1:
        if output.data_ptr() != inputs[0].data_ptr():
            output.copy_(inputs[0])
        return PairwiseWork([], timeout, None)
    piece = max(1, piece_bytes // output.element_size())
    bounds = [(a, min(a + piece, count)) for a in range(0, count, piece)]
    buf = scratch.take((size - 1) * count, dtype)
    received = ScratchPool.view(buf, (size - 1) * count, dtype).view(size - 1, count)
    recvs = []
    # Piece-major order: every peer's first piece arrives before anyone's second, so the
    # reduction can start as soon as the first pieces are in.
    for a, b in bounds:
        for step in range(1, size):
            src = (rank - step) % size
            recvs.append(engine.recv([received[step - 1, a:b]], src, TAG))
    sends = []
    for a, b in bounds:
        for step in range(1, size):
            dst = (rank + step) % size
            sends.append(engine.send([inputs[dst][a:b]], dst, TAG))
    mine = inputs[rank]

    def finish(wait_recv: Callable[[int], None]) -> None:
        index = 0
        for a, b in bounds:
            out = output[a:b]
            for step in range(1, size):
                wait_recv(index)
                index += 1
                reduce(mine[a:b] if step == 1 else out, received[step - 1, a:b], out=out)
        # Only after every receive landed: a failed one may still write into the buffer.
        scratch.give(buf)

    return PairwiseWork(recvs + sends, timeout, finish)
