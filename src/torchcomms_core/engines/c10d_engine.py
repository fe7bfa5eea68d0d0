"""Turn any c10d ``ProcessGroup``/``Backend`` into a torchcomms backend.

A plugin subclasses :class:`C10dBackend` and implements ``create_engine``; every
collective maps onto the engine's c10d call. Operations the engine lacks are listed
in ``engine_unsupported`` and fall back to the spec's portable defaults.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.operations.table import uneven_lists
from torchcomms_core.spec import (
    DERIVABLE_METHODS,
    BatchOp,
    MultiWork,
    TorchCommBackend,
    settle,
)
from torchcomms_core.spec.kit import StoredRankAndSize

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Work

    from torchcomms_core.operations.options import CommOptions


def c10d_module() -> Any:
    """``torch._C._distributed_c10d``, imported on first use."""
    # Imported lazily: torch.distributed imports torchcomms while half-initialised.
    import torch._C._distributed_c10d as c10d

    return c10d


_C10D_OPS: dict[RedOpType, Any] = {}


def to_c10d_reduce_op(op: ReduceOp) -> Any:
    """Return the c10d ``ReduceOp`` equivalent of one of our basic reductions."""
    if not _C10D_OPS:
        red = c10d_module().ReduceOp.RedOpType
        for t in RedOpType:
            if t is not RedOpType.PREMUL_SUM:
                _C10D_OPS[t] = getattr(red, t.name)
    return _C10D_OPS[op.type]


def _make_opts(cls_name: str, timeout: timedelta | None, fields: dict[str, Any]) -> Any:
    opts = getattr(c10d_module(), cls_name)()
    if timeout is not None:
        opts.timeout = timeout
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t`` as one dimension: itself when it is (a view costs microseconds of autograd
    bookkeeping, and flat buffers are what FSDP and most callers pass)."""
    return t if t.dim() == 1 else t.view(-1)


class C10dWork:
    """A c10d ``Work`` waited on with the operation's timeout."""

    __slots__ = ("_work", "_timeout")

    def __init__(self, work: Work, timeout: timedelta | None) -> None:
        self._work = work
        self._timeout = timeout

    def wait(self) -> bool:
        """Wait for the c10d work, within the operation's timeout when it has one.

        Returns:
            What the c10d work's ``wait()`` returns (``True``).

        Raises:
            The engine's error (``RuntimeError`` or torch's ``DistBackendError``) when the
            operation failed or did not finish within the timeout.
        """
        if self._timeout is None:
            return self._work.wait()
        return self._work.wait(self._timeout)

    def is_completed(self) -> bool:
        """Whether the c10d work has finished (successfully or not), without waiting."""
        return self._work.is_completed()


class C10dBackend(StoredRankAndSize, TorchCommBackend):
    """Backend over a c10d engine (``ProcessGroupGloo``, ``ProcessGroupNCCL``, a vendor's)."""

    #: Operations the engine cannot run; they use the spec's portable defaults instead.
    #: c10d's list collectives take equal blocks, so the uneven ones use the defaults.
    engine_unsupported: ClassVar[frozenset[str]] = uneven_lists()
    #: Wrap batched point-to-point ops in c10d coalescing (NCCL groups them this way).
    coalesce_p2p: ClassVar[bool] = False
    # c10d's engines pair a rank with its peers, not with itself.
    allows_self_p2p: ClassVar[bool] = False
    #: Wait for the engine's works within the operation's timeout. ``False``: wait as
    #: c10d does, with no limit of our own, leaving time limits to the engine (for
    #: engines whose works refuse a timed wait, such as Python ones).
    timed_waits: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.engine_unsupported:
            if name not in DERIVABLE_METHODS:
                raise TypeError(
                    f"{cls.__name__}.engine_unsupported names {name!r}, "
                    f"which has no portable default"
                )
            if name not in cls.__dict__:
                setattr(cls, name, getattr(TorchCommBackend, name))

    def __init__(self) -> None:
        self._engine: Any = None
        self._rank = -1
        self._size = -1
        self._opts_cache: dict[tuple[Any, ...], Any] = {}

    # -- engine ----------------------------------------------------------------------

    @abc.abstractmethod
    def create_engine(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        device: torch.device,
        options: CommOptions,
    ) -> Any:
        """Build and return the c10d engine for this communicator."""

    @property
    def engine(self) -> Any:
        """The c10d engine object (``ProcessGroupGloo``, ...)."""
        return self._engine

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        self._rank, self._size = options.rank, options.size
        assert options.timeout is not None  # resolved by the core
        self._engine = self.create_engine(
            options.store, options.rank, options.size, options.timeout, device, options
        )

    def finalize(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            shutdown = getattr(engine, "shutdown", None)
            if shutdown is not None:
                try:
                    shutdown()
                except RuntimeError:
                    pass  # already torn down by an error or abort

    def abort(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.abort()

    def _done(self, work: Any, async_op: bool, timeout: timedelta | None) -> Any:
        if not self.timed_waits:
            timeout = None
        if async_op:
            return C10dWork(work, timeout)
        if timeout is None:
            work.wait()
        else:
            work.wait(timeout)
        return None

    def _opts(self, cls_name: str, timeout: timedelta | None, **fields: Any) -> Any:
        """A c10d options object; reused across calls (engines copy what they keep)."""
        key = (cls_name, timeout, *fields.items())
        cache = self._opts_cache
        try:
            opts = cache.get(key)
        except TypeError:  # an unhashable field (e.g. a device list): build a fresh one
            return _make_opts(cls_name, timeout, fields)
        if opts is None:
            if len(cache) >= 256:  # roots and timeouts vary little; keep the table small
                cache.clear()
            opts = cache[key] = _make_opts(cls_name, timeout, fields)
        return opts

    def _flat_op(self, name: str) -> Any:
        """The engine's entry point ``name`` for a collective over flat tensors
        (``_allgather_base``, ``_reduce_scatter_base``, ``alltoall_base``)."""
        return getattr(self._engine, name)

    # -- point to point --------------------------------------------------------------

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._done(self._engine.send([tensor], dst, 0), async_op, timeout)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._done(self._engine.recv([tensor], src, 0), async_op, timeout)

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        works = self._issue_p2p(ops)
        if not works:
            return None
        return self._done_all(works, async_op, timeout)

    def _issue_p2p(self, ops: Sequence[BatchOp]) -> list[Any]:
        """Issue every op on the engine, in one coalesced group when ``coalesce_p2p``;
        return the works to wait for (the group's one work when the engine gives one)."""
        engine = self._engine
        issued = []
        if self.coalesce_p2p:
            engine._start_coalescing(self.device)
        try:
            for kind, tensor, peer in ops:
                method = engine.send if kind == "send" else engine.recv
                issued.append(method([tensor], peer, 0))
        finally:
            if self.coalesce_p2p:
                coalesced = engine._end_coalescing(self.device)
                if coalesced is not None:
                    issued = [coalesced]
        return [w for w in issued if w is not None]

    def _done_all(self, works: list[Any], async_op: bool, timeout: timedelta | None) -> Any:
        """Like ``_done`` for several engine works at once (a batch)."""
        wait_limit = timeout if self.timed_waits else None
        return settle(MultiWork([C10dWork(w, wait_limit) for w in works]), async_op)

    # -- collectives -----------------------------------------------------------------

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        opts = self._opts("BroadcastOptions", timeout, rootRank=root, rootTensor=0)
        return self._done(self._engine.broadcast([tensor], opts), async_op, timeout)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        opts = self._opts("AllreduceOptions", timeout, reduceOp=to_c10d_reduce_op(op))
        return self._done(self._engine.allreduce([tensor], opts), async_op, timeout)

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
        opts = self._opts(
            "ReduceOptions", timeout, rootRank=root, rootTensor=0, reduceOp=to_c10d_reduce_op(op)
        )
        return self._done(self._engine.reduce([tensor], opts), async_op, timeout)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        opts = self._opts("AllgatherOptions", timeout)
        return self._done(self._engine.allgather([tensor_list], [tensor], opts), async_op, timeout)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        opts = self._opts("AllgatherOptions", timeout)
        # Engines such as gloo want the output as n copies of the input's shape; the core
        # only guarantees matching element counts, so hand them flat views.
        work = self._flat_op("_allgather_base")(_flat(output), _flat(input), opts)
        return self._done(work, async_op, timeout)

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
        opts = self._opts("ReduceScatterOptions", timeout, reduceOp=to_c10d_reduce_op(op))
        return self._done(
            self._engine.reduce_scatter([output], [input_list], opts), async_op, timeout
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
        opts = self._opts("ReduceScatterOptions", timeout, reduceOp=to_c10d_reduce_op(op))
        work = self._flat_op("_reduce_scatter_base")(_flat(output), _flat(input), opts)
        return self._done(work, async_op, timeout)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        sizes = {t.numel() for t in output_tensor_list} | {t.numel() for t in input_tensor_list}
        if len(sizes) > 1:
            # c10d engines such as gloo need equal blocks; uneven ones go point to point.
            return TorchCommBackend.all_to_all(
                self, output_tensor_list, input_tensor_list, async_op, timeout=timeout, hints=hints
            )
        opts = self._opts("AllToAllOptions", timeout)
        return self._done(
            self._engine.alltoall(output_tensor_list, input_tensor_list, opts), async_op, timeout
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
        # The spec's default, inlined (a hot path): equal blocks over alltoall_base.
        return self.all_to_all_v_single(
            output, input, [], [], async_op, timeout=timeout, hints=hints
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
        opts = self._opts("AllToAllOptions", timeout)
        work = self._flat_op("alltoall_base")(
            output, input, list(output_split_sizes), list(input_split_sizes), opts
        )
        return self._done(work, async_op, timeout)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        opts = self._opts("BarrierOptions", timeout)
        return self._done(self._engine.barrier(opts), async_op, timeout)

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
        opts = self._opts("ScatterOptions", timeout, rootRank=root)
        inputs = [input_tensor_list] if self._rank == root else []
        return self._done(self._engine.scatter([output_tensor], inputs, opts), async_op, timeout)

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
        opts = self._opts("GatherOptions", timeout, rootRank=root)
        outputs = [output_tensor_list] if self._rank == root else []
        return self._done(self._engine.gather(outputs, [input_tensor], opts), async_op, timeout)

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
        # The spec's flat views, over the engine's own gather.
        return super().gather_single(output, input, root, async_op, timeout=timeout, hints=hints)

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        if self._engine is not None and hasattr(self._engine, "_set_default_timeout"):
            self._engine._set_default_timeout(timeout)
