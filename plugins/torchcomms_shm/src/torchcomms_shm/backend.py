"""``ShmBackend``: collectives through one shared-memory segment for ranks on one host.

Collectives are lockstep over a staging *arena*: each rank owns a slot of ``arena_bytes``
in two halves; a large message moves through it in chunks of half a slot, alternating
halves, so a rank fills one half while its peers still read the other. Each chunk is one
*step*: every rank writes what it contributes into its own slot, publishes its step
counter, waits until every peer published the same step, then reads what it needs from
the peers' slots. A rank publishes step ``k`` only after finishing its reads of step
``k - 1``, so once it has seen every peer at step ``k`` it may reuse the half of step
``k - 1``. Reductions run on torch's kernels over the staged chunks, in rank order, by
one owner rank per part; every rank copies the owners' results, so results are identical
on every rank.

Point-to-point uses one byte ring per ordered pair of ranks (single writer, single reader;
a bytes-written and a bytes-read counter). Operations are queued per channel and advanced
by whoever waits, so asynchronous sends never block on the receiver.

The backend is one class that holds its parts, each a plain class in a module of its own
that takes the state it shares with the others, a :class:`~torchcomms_shm.lockstep.Lockstep`
(the segment's words and slots, the step counters, the waiting): ``p2p``
(:class:`~torchcomms_shm.p2p.PointToPoint`, the rings), ``collectives``
(:class:`~torchcomms_shm.collectives.Collectives`, the algorithms) and ``small``
(:class:`~torchcomms_shm.small.SmallCollectives`, one-step small collectives through
memoryviews or the compiled call). Its one base, ``comm.ShmComm``, owns the
communicator's life (the segment, finalize, abort, reconfigure), the worker thread and the
windows, and makes the parts. This module has the spec's methods, which pick the part and
the path for each call and run it; the lean all-reduce runs a planned tensor's compiled
call itself, on the state and the small part's plans, without a call through a part.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    BatchOp,
    ReduceOp,
    overlaps,
    split_dim0,
)

from . import segment as seg
from .algorithms import ALGORITHMS
from .collectives import _REDUCE, SMALL_BYTES
from .comm import (
    ARENA_BYTES,
    CMA_BYTES,
    DEFAULT_ARENA_BYTES,
    DEFAULT_CMA_BYTES,
    DEFAULT_P2P_BYTES,
    HOST_ID,
    HOST_ID_ENV,
    NATIVE,
    P2P_BYTES,
    SMALL_PATH_BYTES,
    SPIN_US,
    WAIT,
    YIELD_US,
    ShmComm,
    default_wait,
    host_identity,
    ranks_share_cores,
)
from .copying import as_u8

__all__ = [
    "ARENA_BYTES",
    "CMA_BYTES",
    "DEFAULT_CMA_BYTES",
    "DEFAULT_ARENA_BYTES",
    "DEFAULT_P2P_BYTES",
    "HOST_ID",
    "HOST_ID_ENV",
    "P2P_BYTES",
    "SMALL_BYTES",
    "SMALL_PATH_BYTES",
    "SPIN_US",
    "WAIT",
    "YIELD_US",
    "ShmBackend",
    "default_wait",
    "host_identity",
    "ranks_share_cores",
]


class ShmBackend(ShmComm):
    """CPU communicator over POSIX shared memory for ranks that share one host."""

    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = DEFAULT_DTYPES
    supported_reduce_ops = BASIC_REDUCE_OPS
    #: The arena, all_reduce's and all_to_all's paths, for tuners (``algorithms``, #45).
    algorithms = ALGORITHMS
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        ARENA_BYTES,
        P2P_BYTES,
        SPIN_US,
        YIELD_US,
        CMA_BYTES,
        HOST_ID,
        SMALL_PATH_BYTES,
        NATIVE,
        WAIT,
    )

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return seg.arch_supported()

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.batch_op_issue([("send", tensor, dst)], async_op, timeout=timeout, hints=hints)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.batch_op_issue([("recv", tensor, src)], async_op, timeout=timeout, hints=hints)

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        what = "batch_op_issue" if len(ops) > 1 else ops[0][0] if ops else "batch"
        return self._post(what, ops, async_op, timeout)

    def send_tagged(
        self,
        tensor: torch.Tensor,
        dst: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """:meth:`send` under ``tag`` (matched as ``torchcomms_shm.p2p`` says)."""
        return self._post("send", [("send", tensor, dst)], async_op, timeout, tag)

    def recv_tagged(
        self,
        tensor: torch.Tensor,
        src: int,
        tag: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """:meth:`recv` of the first message ``src`` sent under ``tag``."""
        return self._post("recv", [("recv", tensor, src)], async_op, timeout, tag)

    def recv_anysource(
        self,
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
        tag: int = 0,
    ) -> Any:
        """Receive the first message under ``tag`` from any rank; the work's
        ``source_rank()`` names the sender once it completed."""
        st, p2p = self._lockstep, self._p2p
        with st.lock:
            st.begin("recv", timeout)
            posted = p2p.post([("recv", tensor, -1)], tag)
        work = p2p.work(posted, any_source=True)
        if not async_op:
            work.wait()
        return work

    def _post(
        self,
        what: str,
        ops: Sequence[BatchOp],
        async_op: bool,
        timeout: timedelta | None,
        tag: int = 0,
    ) -> Any:
        """Post ``ops`` under ``tag`` and return their work, or wait for it (``async_op``
        false) and return ``None``."""
        st, p2p = self._lockstep, self._p2p
        with st.lock:
            st.begin(what, timeout)
            posted = p2p.post(ops, tag)
        work = p2p.work(posted)
        if async_op:
            return work
        work.wait()
        return None

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._run("barrier", timeout, async_op, self._lockstep.sync)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        flat, red = tensor.view(-1), op.type

        def body() -> None:
            tuning = self.tuning
            if not self._small.all_reduce(tensor, red, tuning):
                self._coll.all_reduce(flat, _REDUCE[red], tuning)

        return self._run("all_reduce", timeout, async_op, body)

    def lean_calls(self, timeout: timedelta, hints: dict[str, str]) -> dict[str, Any]:
        """The synchronous ``all_reduce``, ``broadcast`` and ``barrier`` for the core's lean
        lane (they skip the keyword handling of the methods; the work is the same).

        The all-reduce of a planned tensor makes the compiled call itself: it reads the
        state and the small part's plans and calls through the objects bound here, one
        attribute load each, and calls no part on the way (a load or a frame more costs
        0.05-0.1 us of a call of about 1.7 us)."""
        seconds = timeout.total_seconds()
        monotonic = time.monotonic
        st, small, coll = self._lockstep, self._small, self._coll
        lock = st.lock

        def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
            if self._jobs:  # asynchronous collectives still queued: in order behind them
                return self.all_reduce(tensor, op, False, timeout=timeout, hints=hints)
            with lock:
                if st.aborted or st.broken is not None or st.mapping is None:
                    st.begin("all_reduce", timeout)  # raises the reason
                red = op._type
                # The compiled one-step call of a tensor seen before (its plan still holds:
                # same tensor, address, size, reduction and tuner), inline: the deadline is
                # set only if the call has to wait past its polls.
                plan = small.plans.get(id(tensor))
                if (
                    plan is not None
                    and plan.one is not None
                    and plan.tensor is tensor
                    and plan.op is red
                    and plan.ptr == tensor.data_ptr()
                    and plan.nbytes == tensor.nbytes
                    and plan.tuning is self.tuning
                ):
                    c, cref, address = plan.one
                    use = st.use = st.use + 1
                    step = st.step = st.step + 1
                    fast = small.fastcall
                    if fast is not None:
                        done = fast(address, use & 1, step, plan.ptr)
                    else:
                        c.half, c.step, c.user = use & 1, step, plan.ptr
                        done = small.native_call(cref)
                    if done == 1:
                        return None
                    st.op, st.seconds = "all_reduce", seconds
                    st.deadline = monotonic() + seconds
                    small.compiled_rest(c, cref, tensor, red, done)
                    return None
                st.op, st.seconds = "all_reduce", seconds
                st.deadline = monotonic() + seconds
                tuning = self.tuning
                if not small.all_reduce(tensor, red, tuning):
                    coll.all_reduce(tensor.view(-1), _REDUCE[red], tuning)
            return None

        def broadcast(tensor: torch.Tensor, root: int) -> Any:
            if self._jobs:
                return self.broadcast(tensor, root, False, timeout=timeout, hints=hints)
            with st.lock:
                if st.aborted or st.broken is not None or st.mapping is None:
                    st.begin("broadcast", timeout)
                st.op, st.seconds = "broadcast", seconds
                st.deadline = monotonic() + seconds
                self._any_broadcast(tensor, root)
            return None

        def barrier() -> Any:
            if self._jobs:
                return self.barrier(False, timeout=timeout, hints=hints)
            with st.lock:
                if st.aborted or st.broken is not None or st.mapping is None:
                    st.begin("barrier", timeout)
                st.op, st.seconds = "barrier", seconds
                st.deadline = monotonic() + seconds
                st.sync()
            return None

        return {"all_reduce": all_reduce, "broadcast": broadcast, "barrier": barrier}

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        blocks = (
            list(input.view(-1).chunk(self._size))
            if input.numel()
            else [input.view(-1)] * self._size
        )
        return self.reduce_scatter_v(output, blocks, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        ins = [t.reshape(-1) for t in input_list]
        out = output.view(-1)
        if any(overlaps(out, t) for t in ins):
            ins = [t.clone() for t in ins]
        fn = _REDUCE[op.type]
        return self._run(
            "reduce_scatter", timeout, async_op, lambda: self._coll.reduce_scatter(out, ins, fn)
        )

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        if (
            output.is_contiguous()
            and input.is_contiguous()
            and self._size > 1
            and 0 < input.nbytes <= self._small.limit
            and output.nbytes == input.nbytes * self._size
            and self._coll.copy_once_choice("all_gather", output.nbytes, self.tuning) != "direct"
        ):

            def body() -> None:
                self._small.all_gather_single(output, input)

            return self._run("all_gather", timeout, async_op, body)
        flat = output.view(-1)
        outs = list(flat.chunk(self._size)) if flat.numel() else [flat] * self._size
        return self.all_gather_v(outs, input, async_op, timeout=timeout, hints=hints)

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        coll = self._coll
        outs = [as_u8(t) for t in tensor_list]
        mine = as_u8(tensor)
        total = sum(t.nbytes for t in tensor_list)
        path = coll.copy_once_choice("all_gather", total, self.tuning)
        if path != "staged":
            if any(overlaps(o, mine) for i, o in enumerate(outs) if i != self._rank):
                mine = mine.clone()

            def direct() -> None:
                coll.all_gather_direct(outs, mine)

            if path == "direct":
                return self._run("all_gather", timeout, async_op, direct)
            return self._run(
                "all_gather",
                timeout,
                async_op,
                lambda: coll.measured(
                    "all_gather", total, direct, lambda: coll.all_gather(outs, mine)
                ),
            )
        if all(t.is_contiguous() for t in tensor_list) and tensor.is_contiguous():
            users = [*tensor_list]

            def body() -> None:
                # The memoryview path stages this rank's input before writing any block.
                if not self._small.all_gather(users, tensor):
                    coll.all_gather(outs, own)

            own = mine
            if any(overlaps(o, mine) for i, o in enumerate(outs) if i != self._rank):
                own = mine.clone()
            return self._run("all_gather", timeout, async_op, body)
        if any(overlaps(o, mine) for i, o in enumerate(outs) if i != self._rank):
            mine = mine.clone()
        return self._run("all_gather", timeout, async_op, lambda: coll.all_gather(outs, mine))

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._run("broadcast", timeout, async_op, lambda: self._any_broadcast(tensor, root))

    def _any_broadcast(self, tensor: torch.Tensor, root: int) -> None:
        """Broadcast by the path chosen for its size (one place: ``copy_once_choice``)."""
        coll = self._coll
        path = coll.copy_once_choice("broadcast", tensor.nbytes, self.tuning)
        if path == "direct":
            coll.broadcast_direct(as_u8(tensor), root)
        elif path == "measured":
            data = as_u8(tensor)
            coll.measured(
                "broadcast",
                tensor.nbytes,
                lambda: coll.broadcast_direct(data, root),
                lambda: coll.broadcast(data, root),
            )
        elif not (tensor.is_contiguous() and self._small.broadcast(tensor, root)):
            coll.broadcast(as_u8(tensor), root)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._exchange(output_tensor_list, input_tensor_list, async_op, timeout, False)

    def _exchange(
        self,
        outputs: list[torch.Tensor],
        inputs: list[torch.Tensor],
        async_op: bool,
        timeout: timedelta | None,
        uniform: bool,
    ) -> Any:
        outs = [as_u8(t) for t in outputs]
        ins = [as_u8(t) for t in inputs]
        if any(overlaps(o, i) for o in outs for i in ins):
            ins = [t.clone() for t in ins]
        return self._run(
            "all_to_all",
            timeout,
            async_op,
            lambda: self._coll.all_to_all(outs, ins, self.tuning, uniform),
        )

    def all_to_all_v_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        n = self._size
        outs = [b.reshape(-1) for b in split_dim0(output, output_split_sizes, n)]
        ins = [b.reshape(-1) for b in split_dim0(input, input_split_sizes, n)]
        uniform = not output_split_sizes and not input_split_sizes
        return self._exchange(outs, ins, async_op, timeout, uniform)
