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
import os
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    BatchOp,
    BootstrapError,
    CommInputError,
    CommOptions,
    ReduceOp,
    TorchCommBackend,
)

_UNSET = object()

#: Environment variable: collectives of at most this many bytes per rank are blocking MPI
#: calls (0: none are).
BLOCKING_BYTES_ENV = "TORCHCOMM_MPI_BLOCKING_BYTES"
DEFAULT_BLOCKING_BYTES = 65536


def blocking_bytes() -> int:
    """``TORCHCOMM_MPI_BLOCKING_BYTES`` (default 64 KiB); must be the same on every rank."""
    raw = os.environ.get(BLOCKING_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_BLOCKING_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise BootstrapError(
            f"{BLOCKING_BYTES_ENV}={raw!r} is not a byte count; set a whole number >= 0 "
            f"(the same on every rank; 0 makes every collective nonblocking), or unset it for "
            f"the default {DEFAULT_BLOCKING_BYTES}"
        )
    return value


class MpiBackend(TorchCommBackend):
    """CPU communicator on MPI: one duplicated MPI communicator per torchcomms communicator."""

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

    # -- lifecycle --------------------------------------------------------------------

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        from mpi4py import MPI

        world = MPI.COMM_WORLD
        wrank, wsize = world.Get_rank(), world.Get_size()
        if (wrank, wsize) != (options.rank, options.size):
            if wsize == 1:
                raise BootstrapError(
                    f"the mpi backend needs its ranks started by mpiexec, but MPI sees a single "
                    f"process while the environment says rank {options.rank} of {options.size}. "
                    f"Launch with `mpiexec -n {options.size} python script.py`"
                )
            raise BootstrapError(
                f"MPI says this process is rank {wrank} of {wsize}, but the environment says "
                f"rank {options.rank} of {options.size}; unset TORCHCOMM_RANK/TORCHCOMM_SIZE, "
                f"RANK/WORLD_SIZE when launching with mpiexec"
            )
        self._setup(world.Dup(), name, options)

    def _setup(self, comm: Any, name: str, options: CommOptions) -> None:
        from mpi4py import MPI

        from . import buffers, watchdog, work

        # The all_reduce fast path's lookups (mpi4py is imported here, not at module import,
        # because importing mpi4py.MPI initialises MPI).
        self._fa, self._types, self._ops = buffers._fromaddress, buffers.MPI_TYPES, buffers._OPS

        self._MPI = MPI
        self._b = buffers
        self._comm = comm
        comm.Set_name(name)
        self._rank: int = comm.Get_rank()
        self._size: int = comm.Get_size()
        self._pending: set[Any] = set()
        # The last timeout seen and its seconds: most calls pass the same object.
        self._td: Any = _UNSET
        self._ts = 0.0
        self._complete = work.complete
        self._test = MPI.Request.Test
        self._windows: list[Any] = []
        # Collectives on at most this many bytes per rank are blocking MPI calls; the
        # watchdog reads ``_watch``, ``(operation, seconds)`` while one runs.
        self._small = blocking_bytes()
        self._watch: tuple[str, float] | None = None
        if self._small:
            watchdog.watch(self)

    def finalize(self) -> None:
        self._release(abort=False)

    def abort(self) -> None:
        """Abandon operations in flight (receives are cancelled) and free the communicator."""
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        comm = getattr(self, "_comm", None)
        if comm is None:
            return
        self._comm = None
        if self._MPI.Is_finalized():  # released at interpreter exit, after MPI_Finalize
            return
        for work in list(self._pending):
            if abort:
                work.cancel()
            else:
                try:
                    work.wait()
                except Exception:  # finalize must release even a failed communicator
                    work.cancel()
        if abort:
            # MPI_Win_free synchronises with the peers, which an abort must not wait for:
            # the windows stay with MPI until it finalizes.
            self._windows.clear()
        for window in list(self._windows):
            window.free()
        if abort and self._watch is not None:
            # Another thread is inside a blocking call on this communicator: freeing it
            # under that call is undefined in MPI. It stays with MPI until it finalizes.
            return
        try:
            comm.Free()
        except self._MPI.Exception:  # an engine that already gave up: nothing to free
            pass

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_backend_name(self) -> str:
        return "mpi"

    def get_comm_name(self) -> str:
        return self.comm_name

    @property
    def engine(self) -> Any:
        """The ``mpi4py.MPI.Intracomm`` under this communicator.

        Reach it with ``comm.get_backend_impl().engine``.
        """
        return self._comm

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
        """Blocking ``all_reduce``, ``broadcast`` and ``all_to_all_single`` for the core.

        The core calls these only with what its lean lane checked (see
        ``TorchCommBackend.lean_calls``), so they skip the methods' keyword handling and
        keep the MPI buffer specs of recent tensors, keyed by address, size, dtype (and
        reduction): building one costs about as much as a blocking call on one element.
        Larger collectives go to the methods. None when small collectives are not
        blocking (``TORCHCOMM_MPI_BLOCKING_BYTES=0``).
        """
        small = self._small
        if not small:
            return {}
        comm, MPI = self._comm, self._MPI
        fa, types, ops, mpi_op = self._fa, self._types, self._ops, self._b.mpi_op
        Allreduce, Bcast, Alltoall, IN_PLACE = (
            comm.Allreduce,
            comm.Bcast,
            comm.Alltoall,
            MPI.IN_PLACE,
        )
        seconds = self._seconds(timeout)
        specs: dict[tuple[Any, ...], Any] = {}
        limit = 64  # a training step reuses a handful of buffers; forget older ones

        def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
            nbytes = tensor.nbytes
            if nbytes > small:
                return self.all_reduce(tensor, op, False, timeout=timeout, hints=hints)
            key = (tensor.data_ptr(), nbytes, tensor.dtype, op._type)
            spec = specs.get(key)
            if spec is None:
                if len(specs) >= limit:
                    specs.clear()
                dtype = key[2]
                spec = specs[key] = (
                    [fa(key[0], nbytes), types[dtype]],
                    ops.get((dtype, op._type)) or mpi_op(op, dtype),
                )
            self._watch = ("all_reduce", seconds)
            try:
                Allreduce(IN_PLACE, spec[0], spec[1])
            finally:
                self._watch = None
            return None

        def broadcast(tensor: torch.Tensor, root: int) -> Any:
            nbytes = tensor.nbytes
            if nbytes > small:
                return self.broadcast(tensor, root, False, timeout=timeout, hints=hints)
            key = (tensor.data_ptr(), nbytes, tensor.dtype)
            spec = specs.get(key)
            if spec is None:
                if len(specs) >= limit:
                    specs.clear()
                spec = specs[key] = [fa(key[0], nbytes), types[key[2]]]
            self._watch = ("broadcast", seconds)
            try:
                Bcast(spec, root)
            finally:
                self._watch = None
            return None

        def all_to_all_single(output: torch.Tensor, input: torch.Tensor) -> Any:
            nbytes = output.nbytes
            o, i = output.data_ptr(), input.data_ptr()
            if nbytes > small or (o != i and o < i + nbytes and i < o + nbytes):
                # large, or partly overlapping (the method copies the input first)
                return self.all_to_all_single(output, input, False, timeout=timeout, hints=hints)
            key = (o, i, nbytes, output.dtype)
            spec = specs.get(key)
            if spec is None:
                if len(specs) >= limit:
                    specs.clear()
                recv = [fa(o, nbytes), types[key[3]]]  # no count: one block per rank
                send = IN_PLACE if o == i else [fa(i, nbytes), types[key[3]]]
                spec = specs[key] = (send, recv)
            self._watch = ("all_to_all_single", seconds)
            try:
                Alltoall(spec[0], spec[1])
            finally:
                self._watch = None
            return None

        return {
            "all_reduce": all_reduce,
            "broadcast": broadcast,
            "all_to_all_single": all_to_all_single,
        }

    # -- plumbing ---------------------------------------------------------------------

    def _seconds(self, timeout: timedelta | None) -> float:
        if timeout is self._td:
            return self._ts
        seconds = (timeout or self.options.timeout or timedelta(seconds=600)).total_seconds()
        self._td, self._ts = timeout, seconds
        return seconds

    def _finish(
        self, what: str, async_op: bool, timeout: timedelta | None, req: Any, keep: Any
    ) -> Any:
        """An issued request: a work for ``async_op``, else completed here (``None``)."""
        if async_op:
            return self._work(what, timeout, [req], keep)
        if not self._test(req):
            self._complete([req], self._seconds(timeout), what)
        return None

    def _work(
        self,
        what: str,
        timeout: timedelta | None,
        reqs: list[Any],
        keep: Any = None,
        then: Any = None,
    ) -> Any:
        from .work import MpiWork

        return MpiWork(reqs, self._seconds(timeout), what, keep, self._pending, then)

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
        work = self._work("batch_op_issue", timeout, reqs, keep)
        if async_op:
            return work
        work.wait()
        return None

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
        if nbytes <= self._small:
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
        if nbytes <= self._small:
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
        if tensor.nbytes <= self._small:
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
        if input.nbytes <= self._small:
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

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.all_gather_v(tensor_list, tensor, async_op, timeout=timeout, hints=hints)

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
        if output.nbytes <= self._small:
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

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.reduce_scatter_v(output, input_list, op, async_op, timeout=timeout, hints=hints)

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
        if nbytes <= self._small:
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
        send = [b.buf(input)[0], sc, _displs(sc), mpi_t]
        recv = [b.buf(output)[0], rc, _displs(rc), mpi_t]
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

    def _blocking(
        self, what: str, timeout: timedelta | None, call: Any, args: tuple[Any, ...]
    ) -> None:
        """Run the blocking MPI ``call`` under the watchdog (complete on return)."""
        self._watch = (what, self._seconds(timeout))
        try:
            call(*args)
        finally:
            self._watch = None

    def _collective(
        self,
        what: str,
        async_op: bool,
        timeout: timedelta | None,
        nonblocking: str,
        args: tuple[Any, ...],
        keep: Any,
    ) -> Any:
        req = getattr(self._comm, nonblocking)(*args)
        return self._finish(what, async_op, timeout, req, keep)

    # -- windows ----------------------------------------------------------------------

    def new_window(self) -> Any:
        """An MPI RMA window engine for the core's ``TorchCommWindow``."""
        from .window import MpiWindowEngine

        engine = MpiWindowEngine(self._comm, self._windows)
        self._windows.append(engine)
        return engine


def _displs(counts: list[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out
