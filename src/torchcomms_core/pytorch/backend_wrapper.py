"""``_BackendWrapper``: a ``torch.distributed.ProcessGroup`` that runs on a ``TorchComm``.

PyTorch imports this module while ``torch.distributed`` is half-initialised, so nothing
here touches ``torch.distributed`` at import time (only ``torch._C._distributed_c10d``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import torch
from torch._C._distributed_c10d import ProcessGroup, Store

from .._anysource import recv_anysource
from .._comm import TorchComm
from .._errors import CommInputError, CommTypeError
from .._reduce_op import ReduceOp, coerce_reduce_op
from ..spec import unflatten_into
from . import profiling
from .work import CommWork

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName

    from .._work import TorchWork

_batch_code: Any = None


def _batch_isend_irecv_code() -> Any:
    global _batch_code
    if _batch_code is None:
        import inspect

        from torch.distributed import distributed_c10d

        _batch_code = inspect.unwrap(distributed_c10d.batch_isend_irecv).__code__
    return _batch_code


def _enclosing_p2p_batch() -> list[Any] | None:
    """The ``p2p_op_list`` of a ``dist.batch_isend_irecv`` call running below us, if any.

    c10d issues a batch to a ``ProcessGroup`` subclass one ``isend``/``irecv`` at a time;
    finding the list lets us collect the whole batch and issue it through the batch API.
    """
    code = _batch_isend_irecv_code()
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code is code:
            ops = frame.f_locals.get("p2p_op_list")
            return ops if isinstance(ops, list) else None
        frame = frame.f_back
    return None


def _timeout(opts: Any) -> timedelta | None:
    # c10d options carry -1 ms ("unset") unless the caller gave a timeout.
    if opts is None:
        return None
    timeout = opts if isinstance(opts, timedelta) else getattr(opts, "timeout", None)
    if isinstance(timeout, timedelta) and timeout > timedelta(0):
        return timeout
    return None


def _reduce_op(opts: Any) -> ReduceOp:
    """Our ``ReduceOp`` for c10d options, a c10d ``ReduceOp``/``RedOpType`` or ours."""
    op = getattr(opts, "reduceOp", opts)
    if op is None:
        return ReduceOp.SUM
    kind = getattr(op, "op", op)
    if getattr(kind, "name", None) == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise CommInputError(
                "ReduceOp.PREMUL_SUM needs a factor; build it with "
                "torch.distributed._make_nccl_premul_sum(factor)"
            )
        return ReduceOp.PREMUL_SUM(factor)
    return coerce_reduce_op(op, "reduceOp")


def _root(opts: Any, name: str = "rootRank") -> int:
    if isinstance(opts, int):
        return opts
    return int(getattr(opts, name, 0))


def _tensor_list(tensors: Any, where: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if not isinstance(tensors, (list, tuple)):
        raise CommTypeError(
            f"{where}: expected a tensor or a list of tensors, got {type(tensors).__name__}"
        )
    return list(tensors)


def _one(tensors: Any, where: str) -> torch.Tensor:
    items = _tensor_list(tensors, where)
    if len(items) != 1:
        raise CommInputError(f"{where}: expected exactly one tensor per process, got {len(items)}")
    return items[0]


class _P2PBatch:
    """Sends and receives collected from one ``batch_isend_irecv`` (or coalescing block)."""

    __slots__ = ("_comm", "key", "expected", "ops", "_work")

    def __init__(self, comm: TorchComm, key: Any, expected: int | None) -> None:
        self._comm = comm
        self.key = key
        self.expected = expected
        self.ops: list[tuple[str, torch.Tensor, int]] = []
        self._work: TorchWork | None = None

    @property
    def full(self) -> bool:
        return self.expected is not None and len(self.ops) >= self.expected

    def issue(self) -> TorchWork:
        """Issue the batch once; the work of its one issue."""
        if self._work is None:
            batch = self._comm.batch_op_create()
            for kind, tensor, peer in self.ops:
                if kind == "send":
                    batch.send(tensor, peer)
                else:
                    batch.recv(tensor, peer)
            self._work = batch.issue(async_op=True)
        return self._work

    def wait(self) -> bool:
        return self.issue().wait()

    def is_completed(self) -> bool:
        return self.issue().is_completed()


class _BackendWrapper(ProcessGroup):
    """A process group that forwards every c10d operation to a ``TorchComm``.

    ``torch.distributed`` builds one per communicator when
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``; ``torchcomms.device_mesh`` builds and
    registers them for meshes. Ranks are the communicator's ranks. It is its own backend
    (``_get_backend(device)`` returns it) and reports its engine's name (``"gloo"``),
    options and profiler records, as a group with that engine would.
    """

    # Backend-level capabilities c10d asks of ``_get_backend(device)``, which is us.
    supports_splitting = True
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, comm: TorchComm) -> None:
        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"_BackendWrapper needs a torchcomms TorchComm, got {type(comm).__name__}"
            )
        # The (store, rank, size) constructor cannot build Python subclasses.
        # The stub lists only that one; c10d also binds (rank, size), which we use.
        super().__init__(comm.get_rank(), comm.get_size())  # type: ignore[call-arg]
        self._comm = comm
        self._device = torch.device(comm.get_device().type)
        self._engine = _c10d_engine(comm)
        # The name c10d's own group would report: the engine's ("gloo"), else the backend's.
        self._backend_name = (
            str(self._engine.name()) if self._engine is not None else comm.get_backend()
        )
        self._options: Any = None
        # c10d keeps a group's name in its backends, and we register none of our own.
        self._group_name = ""
        self._group_desc = "undefined"
        self._global_ranks: list[int] = []
        self._pending: _P2PBatch | None = None
        self._coalesced: list[CommWork] | None = None
        self._split_names: dict[str, int] = {}
        if self._engine is not None:
            # C++ callers (DDP's logger) look the engine up by the type the name says.
            self._register_backend(self._device, _backend_type(self._backend_name), self._engine)

    # -- identity --------------------------------------------------------------------

    def get_comm(self) -> TorchComm:
        """The communicator every operation of this group runs on."""
        return self._comm

    # The stub promises a Store; a communicator created without one has none to give.
    def get_group_store(self) -> Store | None:  # type: ignore[override]
        """The communicator's store (c10d builds further groups on a group's store)."""
        store = self._comm.get_options().store
        return store if isinstance(store, Store) else None

    def getBackendName(self) -> str:  # noqa: N802 - c10d's virtual method name
        return self._backend_name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._set_group_name(name)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = str(desc)

    def _set_group_name(self, name: str) -> None:
        self._group_name = str(name)
        opts = self.options
        if hasattr(opts, "group_name"):
            opts.group_name = self._group_name

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = str(desc)

    def _set_global_ranks(self, ranks: Sequence[int]) -> None:
        """The members' global ranks, as c10d records them in a gloo group's options."""
        self._global_ranks = [int(r) for r in ranks]
        opts = self.options
        if hasattr(opts, "global_ranks_in_group"):
            opts.global_ranks_in_group = list(self._global_ranks)

    @property
    def group_name(self) -> GroupName:
        # GroupName is c10d's NewType of str, so any name is one.
        return cast("GroupName", self._group_name)

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def options(self) -> Any:
        """The backend options c10d's group would hold (the engine's own when it has one)."""
        if self._options is None:
            engine = self._engine
            if engine is not None and hasattr(engine, "options"):
                self._options = engine.options
            else:
                from torch._C._distributed_c10d import Backend

                self._options = Backend.Options(self._backend_name, self._comm.get_timeout())
        return self._options

    @property
    def _device_types(self) -> list[torch.device]:
        return [self._device]

    # The stub returns a c10d Backend; the wrapper is its own backend (see the class doc).
    def _get_backend(self, device: Any) -> _BackendWrapper:  # type: ignore[override]
        kind = torch.device(device).type
        if kind != self._device.type:
            # c10d's own words, so code that handles a plain group's refusal handles ours.
            raise RuntimeError(
                f"No backend type associated with device type {kind} (process group "
                f"{self._group_name!r} runs on {self._device.type} over torchcomms "
                f"communicator {self._comm.get_name()!r})"
            )
        return self

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    def eager_connect_single_device(self, device: Any) -> None:
        """Nothing to do: torchcomms communicators connect when created."""

    def __repr__(self) -> str:
        return f"<_BackendWrapper {self._group_name!r} over {self._comm!r}>"

    # -- lifecycle -------------------------------------------------------------------

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(timeout)

    def abort(self) -> None:
        self._pending = None
        self._comm.abort()

    def shutdown(self) -> None:
        comm = self._comm
        if comm.is_finalized() or comm.is_aborted():
            self._pending = None  # nothing can run on it any more
        else:
            self._flush()
        comm.finalize()

    def split_group(
        self,
        new_ranks: Sequence[int],
        timeout: timedelta | None = None,
        opts: Any = None,
        group_name: str | None = None,
        group_desc: str | None = None,
        device_types: Any = None,
    ) -> _BackendWrapper | None:
        """Split the communicator; every rank of this group calls, non-members get ``None``."""
        self._flush()
        ranks = sorted(int(r) for r in new_ranks)
        if group_name is None:
            from torch.distributed import distributed_c10d

            group_name = distributed_c10d._process_group_name(ranks, use_hashed_name=True)
        if self.rank() not in ranks:
            self._comm.split([], group_name)
            return None
        # c10d names a split after its ranks, so the same ranks split twice (two
        # new_group calls) share a name; members count their splits alike, so each
        # communicator still gets a name of its own.
        seen = self._split_names.get(group_name, 0)
        self._split_names[group_name] = seen + 1
        comm_name = group_name if not seen else f"{group_name}.{seen}"
        child = self._comm.split(ranks, comm_name, timeout=timeout)
        assert child is not None  # members always get a communicator
        pg = _BackendWrapper(child)
        pg._set_group_name(group_name)
        pg._set_group_desc(group_desc or "undefined")
        parent = self._global_ranks or list(range(self.size()))
        pg._set_global_ranks([parent[r] for r in ranks])
        return pg

    def merge_remote_group(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "merge_remote_group is not supported by torchcomms process groups; create a "
            "communicator over the merged ranks with torchcomms.new_comm instead"
        )

    # -- plumbing --------------------------------------------------------------------

    def _flush(self) -> None:
        pending = self._pending
        if pending is not None:
            self._pending = None
            # A batch_isend_irecv that stopped short raised in c10d before reaching us;
            # issuing its first half would leave peers waiting for the rest.
            if pending.expected is None or pending.full:
                pending.issue()

    def _work(
        self,
        works: Sequence[Any],
        result: Any,
        then: Callable[[], None] | None = None,
        source_rank: int | Callable[[], int] = -1,
    ) -> CommWork:
        work = CommWork(works, result, then, source_rank)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

    def _recorded(
        self,
        op: str,
        op_inputs: Sequence[Any],
        work: str,
        work_inputs: Sequence[torch.Tensor],
        issue: Callable[[], CommWork],
        per_input: bool = False,
    ) -> CommWork:
        """Run ``issue`` under the profiler records c10d and the engine would make.

        ``per_input``: the engine records one work per input tensor.
        """
        if not profiling.is_enabled():
            return issue()
        name = f"{self._backend_name}:{work}"
        works = [(name, (t,)) for t in work_inputs] if per_input else [(name, work_inputs)]
        rec = profiling.begin(op, op_inputs, works)
        try:
            result = issue()
        except BaseException:
            if rec is not None:
                rec.issued()
                rec.done()
            raise
        if rec is not None:
            rec.issued()
            result.add_record(rec)
        return result

    def _start_coalescing(self, device: Any = None) -> None:
        self._flush()
        self._coalesced = []

    def _end_coalescing(self, device: Any = None) -> CommWork:
        works, self._coalesced = self._coalesced or [], None
        self._flush()
        return CommWork(works, [t for w in works for t in w.result()])

    # -- point to point --------------------------------------------------------------

    def _p2p(self, kind: str, tensors: Any, peer: int) -> CommWork:
        tensor = _one(tensors, kind)
        ops = _enclosing_p2p_batch() if self._coalesced is None else None
        if ops is None and self._coalesced is None:
            self._flush()
            comm = self._comm
            work = (
                comm.send(tensor, peer, True) if kind == "send" else comm.recv(tensor, peer, True)
            )
            return self._work([work], [tensor], source_rank=peer if kind == "recv" else -1)
        key = "coalescing" if ops is None else ops
        batch = self._pending
        if batch is None or batch.key is not key:
            self._flush()
            batch = self._pending = _P2PBatch(self._comm, key, None if ops is None else len(ops))
        batch.ops.append((kind, tensor, int(peer)))
        if batch.full:
            self._flush()
        return self._work([batch], [tensor], source_rank=peer if kind == "recv" else -1)

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> CommWork:  # noqa: N803
        return self._recorded(
            "c10d::send",
            _SLOTS[4],
            "send",
            _tensor_list(tensors, "send"),
            lambda: self._p2p("send", tensors, dstRank),
        )

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> CommWork:  # noqa: N803
        return self._recorded(
            "c10d::recv_",
            _SLOTS[4],
            "recv",
            _tensor_list(tensors, "recv"),
            lambda: self._p2p("recv", tensors, srcRank),
        )

    def recv_anysource(self, tensors: Any, tag: int = 0) -> CommWork:
        """Receive from whichever rank sends first; ``work._source_rank()`` names it."""
        tensor = _one(tensors, "recv_anysource")

        def issue() -> CommWork:
            self._flush()
            work, source = recv_anysource(self._comm, tensor, True)
            return self._work([work], [tensor], source_rank=source)

        return self._recorded("c10d::recv_any_source_", _SLOTS[3], "recvAnySource", [tensor], issue)

    # -- collectives -----------------------------------------------------------------

    # The stub's overloads add c10d's C++-only (tensor, root, timeout) form; Python code
    # (distributed_c10d) calls (tensors, opts), which this takes.
    def broadcast(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        ts = _tensor_list(tensors, "broadcast")

        def issue() -> CommWork:
            self._flush()
            root, timeout = _root(opts), _timeout(opts)
            works = [self._comm.broadcast(t, root, True, timeout=timeout) for t in ts]
            return self._work(works, ts)

        return self._recorded("c10d::broadcast_", _SLOTS[6], "broadcast", ts, issue)

    # The stub's overloads add c10d's C++-only (tensors, op, timeout) form; Python code
    # (distributed_c10d) calls (tensors, opts), which this takes.
    def allreduce(self, tensors: Any, opts: Any = None) -> CommWork:  # type: ignore[override]
        ts = _tensor_list(tensors, "allreduce")
        if ts and ts[0].is_sparse:
            return self._recorded(
                "c10d::allreduce_",
                _SLOTS[6],
                "sparse_all_reduce",
                ts,
                lambda: self._sparse_allreduce(ts, opts),
            )

        def issue() -> CommWork:
            self._flush()
            op, timeout = _reduce_op(opts), _timeout(opts)
            works = [self._comm.all_reduce(t, op, True, timeout=timeout) for t in ts]
            return self._work(works, ts)

        return self._recorded("c10d::allreduce_", _SLOTS[6], "all_reduce", ts, issue)

    def _sparse_allreduce(self, ts: list[torch.Tensor], opts: Any) -> CommWork:
        from .sparse import sparse_all_reduce

        self._flush()
        op = _reduce_op(opts)
        output = sparse_all_reduce(self._comm, ts, op, _timeout(opts))
        for t in ts:  # as gloo: every input becomes the (coalesced) sum
            t.copy_(output)
        return self._work([], [output])

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> CommWork:
        """One all-reduce over the tensors flattened together; per-tensor results."""
        ts = _tensor_list(tensors, "allreduce_coalesced")

        def issue() -> CommWork:
            _check_coalesced("allreduce_coalesced", ts)
            self._flush()
            op, timeout = _reduce_op(opts), _timeout(opts)
            if len(ts) == 1:
                return self._work([self._comm.all_reduce(ts[0], op, True, timeout=timeout)], ts)
            flat = torch.cat([t.reshape(-1) for t in ts])
            work = self._comm.all_reduce(flat, op, True, timeout=timeout)
            return self._work([work], ts, unflatten_into(flat, ts))

        return self._recorded("c10d::allreduce_coalesced_", _SLOTS[5], "all_reduce", ts, issue)

    # The stub's overloads add c10d's C++-only (tensor, root, op, timeout) form; Python code
    # (distributed_c10d) calls (tensors, opts), which this takes.
    def reduce(  # type: ignore[override]
        self,
        tensors: Any,
        opts: Any = None,
        op: Any = None,
    ) -> CommWork:
        """``reduce(tensors, ReduceOptions)`` or ``reduce(tensor, root, op)``."""
        t = _one(tensors, "reduce")

        def issue() -> CommWork:
            self._flush()
            red = _reduce_op(op if isinstance(opts, int) else opts)
            work = self._comm.reduce(t, _root(opts), red, True, timeout=_timeout(opts))
            return self._work([work], [t])

        return self._recorded("c10d::reduce_", _SLOTS[7], "reduce", [t], issue)

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        if isinstance(input_tensors, torch.Tensor):  # allgather(list, tensor) overload
            output_tensors = [output_tensors]
        ins = _tensor_list(input_tensors, "allgather")

        def issue() -> CommWork:
            self._flush()
            _same_length("allgather", output_tensors, ins)
            timeout = _timeout(opts)
            works = [
                self._comm.all_gather(list(outs), t, True, timeout=timeout)
                for outs, t in zip(output_tensors, ins, strict=True)
            ]
            return self._work(works, output_tensors)

        return self._recorded("c10d::allgather_", _SLOTS[5], "all_gather", ins, issue)

    def allgather_coalesced(self, output_lists: Any, input_list: Any, opts: Any = None) -> CommWork:
        """All-gathers of several tensors in one exchange; ``output_lists[rank][input]``."""
        ins = _tensor_list(input_list, "allgather_coalesced")

        def issue() -> CommWork:
            _check_gather_coalesced(output_lists, ins, self.size())
            self._flush()
            n = self.size()
            flat_in = (
                torch.cat([t.reshape(-1) for t in ins]) if len(ins) > 1 else (ins[0].reshape(-1))
            )
            flat_out = flat_in.new_empty(n * flat_in.numel())
            work = self._comm.all_gather_single(flat_out, flat_in, True, timeout=_timeout(opts))
            rows = flat_out.view(n, -1)
            return self._work(
                [work],
                output_lists,
                _chain([unflatten_into(rows[r], list(output_lists[r])) for r in range(n)]),
            )

        return self._recorded("c10d::allgather_coalesced_", _SLOTS[4], "all_gather", ins, issue)

    def all_gather_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CommWork:
        def issue() -> CommWork:
            self._flush()
            work = self._comm.all_gather_single(output, input, True, timeout=_timeout(opts))
            return self._work([work], [output])

        return self._recorded(
            "c10d::_allgather_base_", (output, input, *_SLOTS[3]), "all_gather", [input], issue
        )

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> CommWork:
        """All-gathers of several tensors, as one exchange per dtype."""
        outs = _tensor_list(outputs, "all_gather_single_coalesced")
        ins = _tensor_list(inputs, "all_gather_single_coalesced")

        def issue() -> CommWork:
            self._flush()
            _same_length("all_gather_single_coalesced", outs, ins)
            timeout = _timeout(opts)
            n = self.size()
            works, steps = [], []
            for idx in _index_by_dtype(ins):
                if len(idx) == 1:
                    i = idx[0]
                    works.append(
                        self._comm.all_gather_single(outs[i], ins[i], True, timeout=timeout)
                    )
                    continue
                for i in idx:
                    if outs[i].numel() != ins[i].numel() * n:
                        raise CommInputError(
                            f"all_gather_single_coalesced: output {i} has {outs[i].numel()} "
                            f"elements but must have input numel * size = "
                            f"{ins[i].numel()} * {n}"
                        )
                flat_in = torch.cat([ins[i].reshape(-1) for i in idx])
                # Flat output: engines split it into chunks shaped like the input.
                flat_out = flat_in.new_empty(n * flat_in.numel())
                works.append(self._comm.all_gather_single(flat_out, flat_in, True, timeout=timeout))
                steps.append(_scatter_columns(flat_out.view(n, -1), [outs[i] for i in idx]))
            return self._work(works, outs, _chain(steps))

        return self._recorded(
            "c10d::allgather_into_tensor_coalesced_", _SLOTS[4], "all_gather", ins, issue
        )

    # c10d's other name for the operation; the stub names its arguments differently.
    allgather_into_tensor_coalesced = all_gather_single_coalesced  # type: ignore[assignment]

    # The stub's overloads add c10d's C++-only (tensor, list, op, timeout) form; Python code
    # (distributed_c10d) calls (outputs, input_lists, opts), which this takes.
    def reduce_scatter(  # type: ignore[override]
        self,
        output_tensors: Any,
        input_lists: Any,
        opts: Any = None,
    ) -> CommWork:
        if isinstance(output_tensors, torch.Tensor):  # reduce_scatter(tensor, list) overload
            input_lists = [input_lists]
        outs = _tensor_list(output_tensors, "reduce_scatter")

        def issue() -> CommWork:
            self._flush()
            _same_length("reduce_scatter", outs, input_lists)
            op, timeout = _reduce_op(opts), _timeout(opts)
            works = [
                self._comm.reduce_scatter(o, list(ins), op, True, timeout=timeout)
                for o, ins in zip(outs, input_lists, strict=True)
            ]
            return self._work(works, outs)

        # Gloo runs a reduce-scatter as one all-reduce per input.
        first = list(input_lists[0]) if input_lists else []
        return self._recorded(
            "c10d::reduce_scatter_", _SLOTS[6], "all_reduce", first, issue, per_input=True
        )

    def reduce_scatter_single(
        self, output: torch.Tensor, input: torch.Tensor, opts: Any = None
    ) -> CommWork:
        def issue() -> CommWork:
            self._flush()
            work = self._comm.reduce_scatter_single(
                output, input, _reduce_op(opts), True, timeout=_timeout(opts)
            )
            return self._work([work], [output])

        return self._recorded(
            "c10d::_reduce_scatter_base_", (output, input, *_SLOTS[4]), "all_reduce", [input], issue
        )

    # c10d's other name for the operation; the stub names its arguments differently.
    _reduce_scatter_base = reduce_scatter_single  # type: ignore[assignment]

    def reduce_scatter_single_coalesced(
        self, outputs: Any, inputs: Any, opts: Any = None
    ) -> CommWork:
        """Reduce-scatters of several tensors, as one exchange per dtype."""
        outs = _tensor_list(outputs, "reduce_scatter_single_coalesced")
        ins = _tensor_list(inputs, "reduce_scatter_single_coalesced")

        def issue() -> CommWork:
            self._flush()
            _same_length("reduce_scatter_single_coalesced", outs, ins)
            op, timeout = _reduce_op(opts), _timeout(opts)
            n = self.size()
            works, steps = [], []
            for idx in _index_by_dtype(ins):
                if len(idx) == 1:
                    i = idx[0]
                    works.append(
                        self._comm.reduce_scatter_single(outs[i], ins[i], op, True, timeout=timeout)
                    )
                    continue
                for i in idx:
                    if ins[i].numel() != outs[i].numel() * n:
                        raise CommInputError(
                            f"reduce_scatter_single_coalesced: input {i} has "
                            f"{ins[i].numel()} elements but must have output numel * size = "
                            f"{outs[i].numel()} * {n}"
                        )
                flat_in = torch.cat([ins[i].reshape(n, -1) for i in idx], dim=1)
                flat_out = flat_in.new_empty(flat_in.shape[1])
                works.append(
                    self._comm.reduce_scatter_single(
                        flat_out, flat_in.reshape(-1), op, True, timeout=timeout
                    )
                )
                steps.append(unflatten_into(flat_out, [outs[i] for i in idx]))
            return self._work(works, outs, _chain(steps))

        # Gloo reduce-scatters each input with an all-reduce of its own.
        return self._recorded(
            "c10d::reduce_scatter_tensor_coalesced_",
            _SLOTS[6],
            "all_reduce",
            ins,
            issue,
            per_input=True,
        )

    # c10d's other name for the operation; the stub names its arguments differently.
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced  # type: ignore[assignment]

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        outs = _tensor_list(output_tensors, "alltoall")
        ins = _tensor_list(input_tensors, "alltoall")

        def issue() -> CommWork:
            self._flush()
            work = self._comm.all_to_all(outs, ins, True, timeout=_timeout(opts))
            return self._work([work], outs)

        return self._recorded("c10d::alltoall_", _SLOTS[5], "all_to_all", ins, issue)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int] = (),
        input_split_sizes: Sequence[int] = (),
        opts: Any = None,
    ) -> CommWork:
        def issue() -> CommWork:
            self._flush()
            timeout = _timeout(opts)
            if (
                not output_split_sizes
                and not input_split_sizes
                and input.dim() > 0
                and (input.shape[0] % self.size() == 0)
            ):
                work = self._comm.all_to_all_single(output, input, True, timeout=timeout)
            else:
                work = self._comm.all_to_all_v_single(
                    output,
                    input,
                    list(output_split_sizes),
                    list(input_split_sizes),
                    True,
                    timeout=timeout,
                )
            return self._work([work], [output])

        return self._recorded(
            "c10d::alltoall_base_", (output, input, *_SLOTS[5]), "all_to_all", [input], issue
        )

    # c10d's other name for the operation; the stub overloads it by argument names.
    alltoall_base = all_to_all_single  # type: ignore[assignment]

    # The stub's overloads add c10d's C++-only (list, tensor, root, timeout) form; Python code
    # (distributed_c10d) calls (output_lists, inputs, opts), which this takes.
    def gather(  # type: ignore[override]
        self,
        output_tensors: Any,
        input_tensors: Any,
        opts: Any = None,
    ) -> CommWork:
        if (
            isinstance(input_tensors, torch.Tensor)
            and output_tensors
            and isinstance(output_tensors[0], torch.Tensor)
        ):  # gather(list, tensor, root) overload
            output_tensors = [output_tensors]
        t = _one(input_tensors, "gather")

        def issue() -> CommWork:
            self._flush()
            root = _root(opts)
            outs = list(output_tensors[0]) if output_tensors and self.rank() == root else []
            work = self._comm.gather(outs, t, root, True, timeout=_timeout(opts))
            return self._work([work], [outs])

        return self._recorded("c10d::gather_", _SLOTS[6], "gather", [t], issue)

    # The stub's overloads add c10d's C++-only (tensor, list, root, timeout) form; Python code
    # (distributed_c10d) calls (outputs, input_lists, opts), which this takes.
    def scatter(  # type: ignore[override]
        self,
        output_tensors: Any,
        input_tensors: Any,
        opts: Any = None,
    ) -> CommWork:
        if (
            isinstance(output_tensors, torch.Tensor)
            and input_tensors
            and isinstance(input_tensors[0], torch.Tensor)
        ):  # scatter(tensor, list, root) overload
            input_tensors = [input_tensors]
        out = _one(output_tensors, "scatter")
        root = _root(opts)
        ins = list(input_tensors[0]) if input_tensors and self.rank() == root else []

        def issue() -> CommWork:
            self._flush()
            work = self._comm.scatter(out, ins, root, True, timeout=_timeout(opts))
            return self._work([work], [out])

        return self._recorded("c10d::scatter_", _SLOTS[6], "scatter", ins, issue)

    # Takes both stub overloads, barrier(opts) and barrier(timeout=...), but they name
    # their first argument differently, which no one signature can match.
    def barrier(  # type: ignore[override]
        self,
        opts: Any = None,
        timeout: timedelta | None = None,
    ) -> CommWork:
        def issue() -> CommWork:
            self._flush()
            work = self._comm.barrier(True, timeout=_timeout(timeout if opts is None else opts))
            return self._work([work], [])

        return self._recorded(
            "c10d::barrier", (_barrier_tensor(1), *_SLOTS[4]), "barrier", (), issue
        )

    def monitored_barrier(
        self, timeout: timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """gloo's ``monitoredBarrier``: rank 0 hears from every rank and names the late ones."""
        from .monitored_barrier import monitored_barrier

        self._flush()
        # The op's record spans the barrier; its sends and receives record themselves.
        rec = profiling.begin(
            "c10d::monitored_barrier_", (_barrier_tensor(0), *_SLOTS[4]), (), quiet=False
        )
        try:
            monitored_barrier(
                self._comm,
                _timeout(timeout) or self._comm.get_timeout(),
                wait_all_ranks,
                self._backend_name,
            )
        finally:
            if rec is not None:
                rec.issued()
                rec.done()


_SLOTS = tuple((None,) * k for k in range(8))
_BARRIER_TENSORS: dict[int, torch.Tensor] = {}


def _barrier_tensor(n: int) -> torch.Tensor:
    """The placeholder tensor c10d passes its barrier ops (recorded as their first input)."""
    t = _BARRIER_TENSORS.get(n)
    if t is None:
        t = _BARRIER_TENSORS[n] = torch.empty(n)
    return t


def _c10d_engine(comm: TorchComm) -> Any:
    """The c10d ``Backend`` a communicator runs on (``ProcessGroupGloo``), if any."""
    from torch._C._distributed_c10d import Backend

    engine = getattr(comm.get_backend_impl(), "engine", None)
    return engine if isinstance(engine, Backend) else None


def _backend_type(name: str) -> Any:
    kinds = ProcessGroup.BackendType
    return {
        "gloo": kinds.GLOO,
        "nccl": kinds.NCCL,
        "ucc": kinds.UCC,
        "mpi": kinds.MPI,
        "xccl": kinds.XCCL,
    }.get(name, kinds.CUSTOM)


def _check_coalesced(where: str, tensors: list[torch.Tensor]) -> None:
    """Gloo's rules for coalesced tensors: at least one, one dtype, one layout, dense."""
    if not tensors:
        raise RuntimeError(f"ProcessGroupGloo::{where}: requires non-empty tensor list")
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            raise RuntimeError(
                f"ProcessGroupGloo::{where}: tensors must all have the same "
                f"type (got {first.dtype} and {t.dtype})"
            )
        if t.layout != first.layout:
            raise RuntimeError(
                f"ProcessGroupGloo::{where}: tensors must all have the same "
                f"layout (got {first.layout} and {t.layout})"
            )
    if first.layout != torch.strided:
        raise RuntimeError(
            f"ProcessGroupGloo::{where}: unsupported layout {first.layout}; "
            f"only dense tensors can be coalesced"
        )


def _check_gather_coalesced(output_lists: Any, ins: list[torch.Tensor], size: int) -> None:
    """Gloo's rules for ``allgather_coalesced``: outputs ``[rank][input]`` like the inputs."""
    where = "ProcessGroupGloo::allgather_coalesced"
    if not ins:
        raise RuntimeError(f"{where}: requires non-empty input list")
    if len(output_lists) != size:
        raise RuntimeError(
            f"{where}: output list should be size {size} (one list per "
            f"rank), got {len(output_lists)}"
        )
    dtype = ins[0].dtype
    for outs in output_lists:
        if len(outs) != len(ins):
            raise RuntimeError(
                f"{where}: invalid output size: (expected length {len(ins)}, got {len(outs)})"
            )
        for i, (out, t) in enumerate(zip(outs, ins, strict=True)):
            if out.shape != t.shape:
                raise RuntimeError(
                    f"{where}: invalid size of output tensor at index {i} "
                    f"(expected length {list(t.shape)}, got {list(out.shape)})"
                )
            if out.dtype != dtype:
                raise RuntimeError(
                    f"{where}: invalid tensor type at index {i} (expected {dtype}, got {out.dtype})"
                )
    if any(t.layout != torch.strided for t in ins):
        raise RuntimeError(f"{where}: only dense tensors are supported")


def _same_length(where: str, outs: Sequence[Any], ins: Sequence[Any]) -> None:
    if len(outs) != len(ins):
        raise CommInputError(
            f"{where}: {len(outs)} outputs for {len(ins)} inputs; pass one output per input"
        )


def _index_by_dtype(tensors: list[torch.Tensor]) -> list[list[int]]:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return list(groups.values())


def _scatter_columns(gathered: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
    """Copy column blocks of a ``[size, total]`` gather into each ``[size * numel]`` output."""

    def step() -> None:
        offset = 0
        rows = gathered.shape[0]
        for out in outs:
            n = out.numel() // rows
            out.copy_(gathered[:, offset : offset + n].reshape(out.shape))
            offset += n

    return step


def _chain(steps: list[Callable[[], None]]) -> Callable[[], None] | None:
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def run() -> None:
        for step in steps:
            step()

    return run


def _guard_register_backend() -> None:
    """Make ``pg._register_backend(device, type, _BackendWrapper(comm))`` fail clearly.

    c10d's ``ProcessGroup._register_backend`` takes a C++ ``Backend``, and torch 2.13 gives
    Python no way to make one (``Backend`` has no Python constructor), so a wrapper cannot be
    registered inside another group. pybind's own refusal lists C++ signatures; this says
    what works instead. Every other call goes to c10d untouched.
    """
    original = ProcessGroup._register_backend
    if getattr(original, "__torchcomms_guard__", False):
        return

    def _register_backend(
        self: Any,
        device: Any,
        backend_type: Any,
        backend: Any = None,
    ) -> Any:
        if isinstance(backend, _BackendWrapper):
            raise CommTypeError(
                "ProcessGroup._register_backend: a torchcomms _BackendWrapper is a whole "
                "ProcessGroup, not a c10d Backend, and torch 2.13 offers no way to build a "
                "Backend from Python. Use the wrapper itself as the group: "
                "torchcomms.device_mesh._create_torchcomm_process_group(comm, group_name), "
                "or init_process_group/new_group with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1"
            )
        return original(self, device, backend_type, backend)

    _register_backend.__torchcomms_guard__ = True  # type: ignore[attr-defined]
    _register_backend.__doc__ = original.__doc__
    ProcessGroup._register_backend = _register_backend  # type: ignore[method-assign]


_guard_register_backend()

__all__ = ["_BackendWrapper"]
