"""``MpiBackend``: every torchcomms operation as one MPI call on the tensors' own memory.

MPI does not match a blocking collective on one rank with a nonblocking one on another,
and torchcomms lets each rank choose ``async_op``, so the choice between the two never
depends on ``async_op``; it depends on the size, which every rank agrees on:

- collectives on at most ``TORCHCOMM_MPI_BLOCKING_BYTES`` bytes per rank (64 KiB by
  default) are blocking MPI calls (``Allreduce``, ``Bcast``, ...), the fastest form; an
  ``async_op=True`` call returns a completed work. MPI cannot time them out: a watchdog
  thread (:mod:`~torchcomms_mpi.watchdog`) reports one that outlives its timeout and
  aborts the job;
- larger collectives, point-to-point and batches are nonblocking (``Iallreduce``,
  ``Isend``, ...): asynchronous calls return an :class:`~torchcomms_mpi.work.MpiWork`,
  synchronous ones complete the request before returning, and an expired timeout raises
  ``CommTimeoutError``.

Launch: ``mpiexec -n N python script.py``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    Algorithm,
    BatchOp,
    CommInputError,
    CommOptions,
    OpAlgorithms,
    Query,
    ReduceOp,
    displacements,
    settle,
)

from .comm import BLOCKING_BYTES_ENV, DEFAULT_BLOCKING_BYTES, MpiComm, blocking_bytes
from .lean import lean_calls

__all__ = ["BLOCKING_BYTES_ENV", "DEFAULT_BLOCKING_BYTES", "MpiBackend", "blocking_bytes"]


def _blocking_rule(backend: Any, query: Query) -> str:
    """blocking up to TORCHCOMM_MPI_BLOCKING_BYTES (64 KiB) per rank, nonblocking above"""
    small = getattr(backend, "_small", None)
    return (
        "blocking"
        if query.nbytes <= (blocking_bytes() if small is None else small)
        else ("nonblocking")
    )


#: The two forms of every sized collective (#45). ``nbytes`` is the bytes per rank the
#: method compared before: the tensor (all_reduce, broadcast, reduce), the input
#: (all_gather_single), the output (reduce_scatter_single, all_to_all_single).
_FORMS = OpAlgorithms(
    (
        Algorithm("blocking", doc="one blocking MPI call (Allreduce, ...); the watchdog times it"),
        Algorithm("nonblocking", doc="a nonblocking MPI call (Iallreduce, ...) and its request"),
    ),
    default=_blocking_rule,
    forced_by=(f"${BLOCKING_BYTES_ENV}",),
)


class MpiBackend(MpiComm):
    """CPU communicator on MPI: one duplicated MPI communicator per torchcomms communicator."""

    #: Blocking or nonblocking, per operation and size; every rank takes the same (#45).
    algorithms: ClassVar[Mapping[str, OpAlgorithms]] = {
        op: _FORMS
        for op in (
            "all_reduce",
            "broadcast",
            "reduce",
            "all_gather_single",
            "reduce_scatter_single",
            "all_to_all_single",
        )
    }

    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = DEFAULT_DTYPES
    supported_reduce_ops = BASIC_REDUCE_OPS
    #: MPI rendezvouses through mpiexec: no MASTER_ADDR needed.
    needs_store: ClassVar[bool] = False
    launcher: ClassVar[str | None] = "mpiexec"
    # A large blocking send to oneself would wait for a receive not yet posted.
    allows_self_p2p: ClassVar[bool] = False
    #: MPI reads no hints: any hint passed is reported once.
    hint_keys: ClassVar[tuple[str, ...] | None] = ()

    @classmethod
    def reconfigure_support(cls) -> tuple[bool, str]:
        """MPI cannot rebind to a new membership: MPICH has no fault-tolerant communicators
        (no ULFM), so a dead rank ends the whole MPI job."""
        return False, (
            "MPICH has no fault-tolerant communicators (no ULFM shrink/revoke), so a dead "
            "rank ends the MPI job"
        )

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        # Importing mpi4py.MPI initialises MPI, so only look for it here.
        if importlib.util.find_spec("mpi4py") is None:
            return False, "mpi4py is not installed: pip install mpi4py mpich"
        return True, "ok"

    def split(self, ranks: list[int], name: str, options: CommOptions) -> MpiBackend | None:
        # MPI_Comm_create_group is collective over the new group only: ranks outside it
        # need not take part, exactly like the core's split contract.
        if not ranks:
            return None
        group = self._comm.Get_group().Incl(sorted(ranks))
        try:
            sub = self._comm.Create_group(group, tag=min(ranks))
        finally:
            group.Free()
        child = MpiBackend()
        child._bind(self.device, name, options)
        child._setup(sub, name, options)
        return child

    # -- the core's lean lane ---------------------------------------------------------

    def lean_calls(self, timeout: timedelta, hints: dict[str, str]) -> dict[str, Any]:
        """Blocking ``all_reduce``, ``broadcast`` and ``all_to_all_single`` for the core's
        lean lane, keeping the MPI buffer specs of recent tensors
        (:func:`~torchcomms_mpi.lean.lean_calls`); none when
        ``TORCHCOMM_MPI_BLOCKING_BYTES=0``."""
        return lean_calls(self, timeout, hints)

    # -- point to point ---------------------------------------------------------------

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._finish(
            "send", async_op, timeout, self._comm.Isend(self._b.buf(tensor), dst), tensor
        )

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._finish(
            "recv", async_op, timeout, self._comm.Irecv(self._b.buf(tensor), src), tensor
        )

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
        """:meth:`send` under ``tag``, which MPI matches with the receive's (MPI tags)."""
        req = self._comm.Isend(self._b.buf(tensor), dst, self._mpi_tag(tag))
        return self._finish("send", async_op, timeout, req, tensor)

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
        """:meth:`recv` of the message ``src`` sent under ``tag``."""
        req = self._comm.Irecv(self._b.buf(tensor), src, self._mpi_tag(tag))
        return self._finish("recv", async_op, timeout, req, tensor)

    def recv_anysource(
        self,
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
        tag: int = 0,
    ) -> Any:
        """Receive the first matching message from any rank (``MPI_ANY_SOURCE``, under
        ``tag``); the work's ``source_rank()`` names the sender once it completed."""
        from .work import AnySourceWork

        any_source = self._MPI.ANY_SOURCE
        req = self._comm.Irecv(self._b.buf(tensor), any_source, self._mpi_tag(tag))
        work = AnySourceWork(req, self._seconds(timeout), tensor, self._pending)
        if not async_op:
            work.wait()
        return work

    def _mpi_tag(self, tag: int) -> int:
        """``tag`` as an MPI tag, refused past the MPI library's ``MPI_TAG_UB``."""
        upper = self._tag_ub
        if upper is None:
            upper = self._tag_ub = int(self._comm.Get_attr(self._MPI.TAG_UB))
        if not 0 <= tag <= upper:
            raise CommInputError(
                f"tag={tag}: this MPI library takes tags from 0 to {upper} (MPI_TAG_UB); "
                f"pass a tag in that range"
            )
        return tag

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        comm, buf = self._comm, self._b.buf
        reqs, keep = [], []
        for kind, tensor, peer in ops:
            b = buf(tensor)
            keep.append(tensor)
            reqs.append(comm.Isend(b, peer) if kind == "send" else comm.Irecv(b, peer))
        return settle(self._work("batch_op_issue", timeout, reqs, keep), async_op)

    # -- collectives ------------------------------------------------------------------

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        dtype, nbytes = tensor.dtype, tensor.nbytes
        b = [self._fa(tensor.data_ptr(), nbytes), self._types[dtype]]
        mop = self._ops.get((dtype, op._type)) or self._b.mpi_op(op, dtype)
        if self.tuning.choose("all_reduce", nbytes, dtype).algorithm == "blocking":
            # _blocking() inlined here, in broadcast and in all_to_all_single: these three
            # are the lean lane's, where one more Python call shows at one element.
            self._watch = (
                "all_reduce",
                self._ts if timeout is self._td else self._seconds(timeout),
            )
            try:
                self._comm.Allreduce(self._MPI.IN_PLACE, b, mop)
            finally:
                self._watch = None
            return None
        req = self._comm.Iallreduce(self._MPI.IN_PLACE, b, mop)
        if async_op:
            return self._work("all_reduce", timeout, [req], tensor)
        # Completion inline: at small sizes the per-call cost is what shows.
        if not self._test(req):
            self._complete(
                [req], self._ts if timeout is self._td else self._seconds(timeout), "all_reduce"
            )
        return None

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        nbytes = tensor.nbytes
        b = [self._fa(tensor.data_ptr(), nbytes), self._types[tensor.dtype]]
        if self.tuning.choose("broadcast", nbytes, tensor.dtype).algorithm == "blocking":
            self._watch = ("broadcast", self._ts if timeout is self._td else self._seconds(timeout))
            try:
                self._comm.Bcast(b, root)
            finally:
                self._watch = None
            return None
        req = self._comm.Ibcast(b, root)
        if async_op:
            return self._work("broadcast", timeout, [req], tensor)
        if not self._test(req):  # inline: at small sizes the per-call cost is what shows
            self._complete(
                [req], self._ts if timeout is self._td else self._seconds(timeout), "broadcast"
            )
        return None

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b.buf(tensor)
        mop = self._b.mpi_op(op, tensor.dtype)
        comm = self._comm
        if self._rank == root:
            args: tuple[Any, ...] = (self._MPI.IN_PLACE, b, mop, root)
        else:
            args = (b, None, mop, root)
        if self.tuning.choose("reduce", tensor.nbytes, tensor.dtype).algorithm == "blocking":
            return self._blocking("reduce", timeout, comm.Reduce, args)
        return self._finish("reduce", async_op, timeout, comm.Ireduce(*args), tensor)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        if self._small:
            return self._blocking("barrier", timeout, self._comm.Barrier, ())
        return self._finish("barrier", async_op, timeout, self._comm.Ibarrier(), None)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b
        recv = b.blocked(output)
        if input.numel() and input.data_ptr() == output.data_ptr() + self._rank * input.nbytes:
            send: Any = self._MPI.IN_PLACE  # the input already sits in this rank's slot
        else:
            send = b.buf(input)
        if (
            self.tuning.choose("all_gather_single", input.nbytes, input.dtype).algorithm
            == "blocking"
        ):
            return self._blocking("all_gather_single", timeout, self._comm.Allgather, (send, recv))
        return self._collective(
            "all_gather_single", async_op, timeout, "Iallgather", (send, recv), (output, input)
        )

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        recv = self._b.scattered(tensor_list)
        mine = tensor_list[self._rank]
        if self._b.same_memory(mine, tensor):
            send: Any = self._MPI.IN_PLACE
        elif self._b.overlaps(mine, tensor):
            raise CommInputError(
                f"all_gather: tensor_list[{self._rank}] partly overlaps the "
                f"input tensor; pass the same tensor or separate memory"
            )
        else:
            send = [self._b.buf(tensor)[0], tensor.nbytes, self._MPI.BYTE]
        return self._collective(
            "all_gather", async_op, timeout, "Iallgatherv", (send, recv), (tensor_list, tensor)
        )

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
        b = self._b
        if b.overlaps(output, input):
            input = input.clone()  # MPI refuses aliased buffers; the result goes elsewhere
        mop = b.mpi_op(op, output.dtype)
        send, recv = b.blocked(input), b.buf(output)
        choice = self.tuning.choose("reduce_scatter_single", output.nbytes, output.dtype)
        if choice.algorithm == "blocking":
            return self._blocking(
                "reduce_scatter_single", timeout, self._comm.Reduce_scatter_block, (send, recv, mop)
            )
        return self._collective(
            "reduce_scatter_single",
            async_op,
            timeout,
            "Ireduce_scatter_block",
            (send, recv, mop),
            (output, input),
        )

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
        b = self._b
        counts = [t.numel() for t in input_list]
        # MPI_Reduce_scatter takes one send buffer: blocks that are not already one run of
        # memory are packed into one (the only copy this backend makes).
        flat = b.contiguous_run(input_list)
        if flat is None or b.overlaps(flat, output):
            flat = torch.cat([t.reshape(-1) for t in input_list])
        mop = b.mpi_op(op, output.dtype)
        send = b.buf(flat)
        recv = b.first(output, counts[self._rank])
        return self._collective(
            "reduce_scatter",
            async_op,
            timeout,
            "Ireduce_scatter",
            (send, recv, counts, mop),
            (output, flat),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        fa, mpi_type = self._fa, self._types[output.dtype]
        o, i, nbytes = output.data_ptr(), input.data_ptr(), output.nbytes
        recv = [fa(o, nbytes), mpi_type]  # no count: mpi4py splits it into one block per rank
        if o < i + nbytes and i < o + nbytes and nbytes:  # overlapping: MPI refuses aliases
            if o != i:
                input = input.clone()
                send: Any = [fa(input.data_ptr(), nbytes), mpi_type]
            else:
                send = self._MPI.IN_PLACE
        else:
            send = [fa(i, nbytes), mpi_type]
        if self.tuning.choose("all_to_all_single", nbytes, output.dtype).algorithm == "blocking":
            self._watch = (
                "all_to_all_single",
                self._ts if timeout is self._td else self._seconds(timeout),
            )
            try:
                self._comm.Alltoall(send, recv)
            finally:
                self._watch = None
            return None
        req = self._comm.Ialltoall(send, recv)
        if async_op:
            return self._work("all_to_all_single", timeout, [req], (output, input))
        if not self._test(req):
            self._complete(
                [req],
                self._ts if timeout is self._td else self._seconds(timeout),
                "all_to_all_single",
            )
        return None

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
        b = self._b
        if b.overlaps(output, input):
            input = input.clone()
        row_out = output[0].numel() if output.shape[0] else 0
        row_in = input[0].numel() if input.shape[0] else 0
        mpi_t = b.MPI_TYPES[output.dtype]
        sc = [s * row_in for s in input_split_sizes]
        rc = [s * row_out for s in output_split_sizes]
        send = [b.buf(input)[0], sc, displacements(sc), mpi_t]
        recv = [b.buf(output)[0], rc, displacements(rc), mpi_t]
        return self._collective(
            "all_to_all_v_single", async_op, timeout, "Ialltoallv", (send, recv), (output, input)
        )

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b
        ins = list(input_tensor_list)
        for i, t in enumerate(ins):
            if any(b.overlaps(t, o) for o in output_tensor_list):
                ins[i] = t.clone()
        send, recv = b.scattered(ins), b.scattered(output_tensor_list)
        return self._collective(
            "all_to_all", async_op, timeout, "Ialltoallv", (send, recv), (output_tensor_list, ins)
        )

    def scatter(
        self,
        output_tensor: torch.Tensor,
        input_tensor_list: list[torch.Tensor],
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b
        recv: Any = [b.buf(output_tensor)[0], output_tensor.nbytes, self._MPI.BYTE]
        send: Any = None
        if self._rank == root:
            send = b.scattered(input_tensor_list)
            mine = input_tensor_list[root]
            if b.same_memory(mine, output_tensor):
                recv = self._MPI.IN_PLACE
            elif b.overlaps(mine, output_tensor):
                send = b.scattered([t.clone() for t in input_tensor_list])
        return self._collective(
            "scatter",
            async_op,
            timeout,
            "Iscatterv",
            (send, recv, root),
            (output_tensor, input_tensor_list),
        )

    def gather(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b
        send: Any = [b.buf(input_tensor)[0], input_tensor.nbytes, self._MPI.BYTE]
        recv: Any = None
        if self._rank == root:
            recv = b.scattered(output_tensor_list)
            mine = output_tensor_list[root]
            if b.same_memory(mine, input_tensor):
                send = self._MPI.IN_PLACE
            elif b.overlaps(mine, input_tensor):
                input_tensor = input_tensor.clone()
                send = [b.buf(input_tensor)[0], input_tensor.nbytes, self._MPI.BYTE]
        return self._collective(
            "gather",
            async_op,
            timeout,
            "Igatherv",
            (send, recv, root),
            (output_tensor_list, input_tensor),
        )

    def gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        b = self._b
        send: Any = b.buf(input)
        recv: Any = None
        if self._rank == root:
            recv = b.blocked(output)
            if input.numel() and input.data_ptr() == output.data_ptr() + root * input.nbytes:
                send = self._MPI.IN_PLACE
            elif b.overlaps(output, input):
                input = input.clone()
                send = b.buf(input)
        return self._collective(
            "gather_single", async_op, timeout, "Igather", (send, recv, root), (output, input)
        )
