"""``_BackendWrapper``: a ``torch.distributed.ProcessGroup`` that runs on a ``TorchComm``.

PyTorch imports this module while ``torch.distributed`` is half-initialised, so nothing
here touches ``torch.distributed`` at import time (only ``torch._C._distributed_c10d``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup, Store

from ..comm import TorchComm
from ..errors import CommInputError, CommTypeError
from ..reduce_op import ReduceOp, coerce_reduce_op
from .work import CommWork

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
    frame = sys._getframe(2)
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
        raise CommTypeError(f"{where}: expected a tensor or a list of tensors, got "
                            f"{type(tensors).__name__}")
    return list(tensors)


def _one(tensors: Any, where: str) -> torch.Tensor:
    items = _tensor_list(tensors, where)
    if len(items) != 1:
        raise CommInputError(f"{where}: expected exactly one tensor per process, got "
                             f"{len(items)}")
    return items[0]


class _P2PBatch:
    """Sends and receives collected from one ``batch_isend_irecv`` (or coalescing block)."""

    __slots__ = ("_comm", "key", "expected", "ops", "_work")

    def __init__(self, comm: TorchComm, key: Any, expected: int | None) -> None:
        self._comm = comm
        self.key = key
        self.expected = expected
        self.ops: list[tuple[str, torch.Tensor, int]] = []
        self._work: Any = None

    @property
    def full(self) -> bool:
        return self.expected is not None and len(self.ops) >= self.expected

    def issue(self) -> None:
        if self._work is None:
            batch = self._comm.batch_op_create()
            for kind, tensor, peer in self.ops:
                if kind == "send":
                    batch.send(tensor, peer)
                else:
                    batch.recv(tensor, peer)
            self._work = batch.issue(async_op=True)

    def wait(self) -> bool:
        self.issue()
        return self._work.wait()

    def is_completed(self) -> bool:
        self.issue()
        return self._work.is_completed()


class _BackendWrapper(ProcessGroup):
    """A process group that forwards every c10d operation to a ``TorchComm``.

    ``torch.distributed`` builds one per communicator when
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``; ``torchcomms.device_mesh`` builds and
    registers them for meshes. Ranks are the communicator's ranks.
    """

    # Backend-level capabilities c10d asks of ``_get_backend(device)``, which is us.
    supports_splitting = True
    supports_coalescing = False
    supports_time_estimate = False

    def __init__(self, comm: TorchComm) -> None:
        if not isinstance(comm, TorchComm):
            raise CommTypeError(f"_BackendWrapper needs a torchcomms TorchComm, got "
                                f"{type(comm).__name__}")
        # The (store, rank, size) constructor cannot build Python subclasses.
        super().__init__(comm.get_rank(), comm.get_size())
        self._comm = comm
        self._device = torch.device(comm.get_device().type)
        # c10d keeps a group's name in its backends, and we register none.
        self._group_name = ""
        self._group_desc = "undefined"
        self._pending: _P2PBatch | None = None
        self._coalesced: list[CommWork] | None = None

    # -- identity --------------------------------------------------------------------

    def get_comm(self) -> TorchComm:
        """The communicator every operation of this group runs on."""
        return self._comm

    def get_group_store(self) -> Store | None:
        """The communicator's store (c10d builds further groups on a group's store)."""
        store = self._comm.get_options().store
        return store if isinstance(store, Store) else None

    def getBackendName(self) -> str:  # noqa: N802 - c10d's virtual method name
        # Not plain "gloo"/"nccl": C++ code (DDP's logger) looks up an engine of that
        # type inside a group that says so, and this group registers no engine.
        return f"torchcomms_{self._comm.get_backend()}"

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._group_name = str(name)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._group_desc = str(desc)

    def _set_group_name(self, name: str) -> None:
        self._group_name = str(name)

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = str(desc)

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def _device_types(self) -> list[torch.device]:
        return [self._device]

    def _get_backend(self, device: Any) -> _BackendWrapper:
        kind = torch.device(device).type
        if kind != self._device.type:
            raise CommInputError(
                f"process group {self._group_name!r} runs on {self._device.type} (communicator "
                f"{self._comm.get_name()!r}); it has no backend for device {kind!r}"
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

    def split_group(self, new_ranks: Sequence[int], timeout: timedelta | None = None,
                    opts: Any = None, group_name: str | None = None,
                    group_desc: str | None = None,
                    device_types: Any = None) -> _BackendWrapper | None:
        """Split the communicator; every rank of this group calls, non-members get ``None``."""
        self._flush()
        ranks = sorted(int(r) for r in new_ranks)
        if group_name is None:
            from torch.distributed import distributed_c10d

            group_name = distributed_c10d._process_group_name(ranks, use_hashed_name=True)
        if self.rank() not in ranks:
            self._comm.split([], group_name)
            return None
        child = self._comm.split(ranks, group_name, timeout=timeout)
        assert child is not None  # members always get a communicator
        pg = _BackendWrapper(child)
        pg._set_group_name(group_name)
        pg._set_group_desc(group_desc or "undefined")
        from .flight_recorder import inherit_recorders

        inherit_recorders(self._comm, child)
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

    def _work(self, works: Sequence[Any], result: Any, then: Callable[[], None] | None = None,
              source_rank: int = -1) -> CommWork:
        work = CommWork(works, result, then, source_rank)
        if self._coalesced is not None:
            self._coalesced.append(work)
        return work

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
            work = (comm.send(tensor, peer, True) if kind == "send"
                    else comm.recv(tensor, peer, True))
            return self._work([work], [tensor], source_rank=peer if kind == "recv" else -1)
        key = "coalescing" if ops is None else ops
        batch = self._pending
        if batch is None or batch.key is not key:
            self._flush()
            batch = self._pending = _P2PBatch(self._comm, key,
                                              None if ops is None else len(ops))
        batch.ops.append((kind, tensor, int(peer)))
        if batch.full:
            self._flush()
        return self._work([batch], [tensor], source_rank=peer if kind == "recv" else -1)

    def send(self, tensors: Any, dstRank: int, tag: int = 0) -> CommWork:  # noqa: N803
        return self._p2p("send", tensors, dstRank)

    def recv(self, tensors: Any, srcRank: int, tag: int = 0) -> CommWork:  # noqa: N803
        return self._p2p("recv", tensors, srcRank)

    def recv_anysource(self, tensors: Any, tag: int = 0) -> CommWork:
        raise NotImplementedError(
            "torchcomms process groups cannot receive from any source; pass the sender's "
            "rank (src=...)"
        )

    # -- collectives -----------------------------------------------------------------

    def broadcast(self, tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        ts = _tensor_list(tensors, "broadcast")
        root, timeout = _root(opts), _timeout(opts)
        works = [self._comm.broadcast(t, root, True, timeout=timeout) for t in ts]
        return self._work(works, ts)

    def allreduce(self, tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        ts = _tensor_list(tensors, "allreduce")
        op, timeout = _reduce_op(opts), _timeout(opts)
        works = [self._comm.all_reduce(t, op, True, timeout=timeout) for t in ts]
        return self._work(works, ts)

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> CommWork:
        """One all-reduce per dtype over the tensors flattened together."""
        self._flush()
        ts = _tensor_list(tensors, "allreduce_coalesced")
        op, timeout = _reduce_op(opts), _timeout(opts)
        works, steps = [], []
        for group in _by_dtype(ts):
            if len(group) == 1:
                works.append(self._comm.all_reduce(group[0], op, True, timeout=timeout))
                continue
            flat = torch.cat([t.reshape(-1) for t in group])
            works.append(self._comm.all_reduce(flat, op, True, timeout=timeout))
            steps.append(_unflatten_into(flat, group))
        return self._work(works, ts, _chain(steps))

    def reduce(self, tensors: Any, opts: Any = None, op: Any = None) -> CommWork:
        """``reduce(tensors, ReduceOptions)`` or ``reduce(tensor, root, op)``."""
        self._flush()
        t = _one(tensors, "reduce")
        red = _reduce_op(op if isinstance(opts, int) else opts)
        work = self._comm.reduce(t, _root(opts), red, True, timeout=_timeout(opts))
        return self._work([work], [t])

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        if isinstance(input_tensors, torch.Tensor):  # allgather(list, tensor) overload
            output_tensors = [output_tensors]
        ins = _tensor_list(input_tensors, "allgather")
        _same_length("allgather", output_tensors, ins)
        timeout = _timeout(opts)
        works = [self._comm.all_gather(list(outs), t, True, timeout=timeout)
                 for outs, t in zip(output_tensors, ins, strict=True)]
        return self._work(works, output_tensors)

    def allgather_coalesced(self, output_lists: Any, input_list: Any,
                            opts: Any = None) -> CommWork:
        self._flush()
        ins = _tensor_list(input_list, "allgather_coalesced")
        _same_length("allgather_coalesced", output_lists, ins)
        timeout = _timeout(opts)
        works = [self._comm.all_gather(list(outs), t, True, timeout=timeout)
                 for outs, t in zip(output_lists, ins, strict=True)]
        return self._work(works, output_lists)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor,
                          opts: Any = None) -> CommWork:
        self._flush()
        work = self._comm.all_gather_single(output, input, True, timeout=_timeout(opts))
        return self._work([work], [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any,
                                    opts: Any = None) -> CommWork:
        """All-gathers of several tensors, as one exchange per dtype."""
        self._flush()
        outs = _tensor_list(outputs, "all_gather_single_coalesced")
        ins = _tensor_list(inputs, "all_gather_single_coalesced")
        _same_length("all_gather_single_coalesced", outs, ins)
        timeout = _timeout(opts)
        n = self.size()
        works, steps = [], []
        for idx in _index_by_dtype(ins):
            if len(idx) == 1:
                i = idx[0]
                works.append(self._comm.all_gather_single(outs[i], ins[i], True,
                                                          timeout=timeout))
                continue
            for i in idx:
                if outs[i].numel() != ins[i].numel() * n:
                    raise CommInputError(
                        f"all_gather_single_coalesced: output {i} has {outs[i].numel()} "
                        f"elements but must have input numel * size = {ins[i].numel()} * {n}"
                    )
            flat_in = torch.cat([ins[i].reshape(-1) for i in idx])
            # Flat output: engines split it into chunks shaped like the input.
            flat_out = flat_in.new_empty(n * flat_in.numel())
            works.append(self._comm.all_gather_single(flat_out, flat_in, True, timeout=timeout))
            steps.append(_scatter_columns(flat_out.view(n, -1), [outs[i] for i in idx]))
        return self._work(works, outs, _chain(steps))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, output_tensors: Any, input_lists: Any, opts: Any = None) -> CommWork:
        self._flush()
        if isinstance(output_tensors, torch.Tensor):  # reduce_scatter(tensor, list) overload
            input_lists = [input_lists]
        outs = _tensor_list(output_tensors, "reduce_scatter")
        _same_length("reduce_scatter", outs, input_lists)
        op, timeout = _reduce_op(opts), _timeout(opts)
        works = [self._comm.reduce_scatter(o, list(ins), op, True, timeout=timeout)
                 for o, ins in zip(outs, input_lists, strict=True)]
        return self._work(works, outs)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,
                              opts: Any = None) -> CommWork:
        self._flush()
        work = self._comm.reduce_scatter_single(output, input, _reduce_op(opts), True,
                                                timeout=_timeout(opts))
        return self._work([work], [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any,
                                        opts: Any = None) -> CommWork:
        """Reduce-scatters of several tensors, as one exchange per dtype."""
        self._flush()
        outs = _tensor_list(outputs, "reduce_scatter_single_coalesced")
        ins = _tensor_list(inputs, "reduce_scatter_single_coalesced")
        _same_length("reduce_scatter_single_coalesced", outs, ins)
        op, timeout = _reduce_op(opts), _timeout(opts)
        n = self.size()
        works, steps = [], []
        for idx in _index_by_dtype(ins):
            if len(idx) == 1:
                i = idx[0]
                works.append(self._comm.reduce_scatter_single(outs[i], ins[i], op, True,
                                                              timeout=timeout))
                continue
            for i in idx:
                if ins[i].numel() != outs[i].numel() * n:
                    raise CommInputError(
                        f"reduce_scatter_single_coalesced: input {i} has {ins[i].numel()} "
                        f"elements but must have output numel * size = "
                        f"{outs[i].numel()} * {n}"
                    )
            flat_in = torch.cat([ins[i].reshape(n, -1) for i in idx], dim=1)
            flat_out = flat_in.new_empty(flat_in.shape[1])
            works.append(self._comm.reduce_scatter_single(flat_out, flat_in.reshape(-1), op,
                                                          True, timeout=timeout))
            steps.append(_unflatten_into(flat_out, [outs[i] for i in idx]))
        return self._work(works, outs, _chain(steps))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        outs = _tensor_list(output_tensors, "alltoall")
        work = self._comm.all_to_all(outs, _tensor_list(input_tensors, "alltoall"), True,
                                     timeout=_timeout(opts))
        return self._work([work], outs)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_split_sizes: Sequence[int] = (),
                          input_split_sizes: Sequence[int] = (), opts: Any = None) -> CommWork:
        self._flush()
        timeout = _timeout(opts)
        if not output_split_sizes and not input_split_sizes and input.dim() > 0 and (
                input.shape[0] % self.size() == 0):
            work = self._comm.all_to_all_single(output, input, True, timeout=timeout)
        else:
            work = self._comm.all_to_all_v_single(output, input, list(output_split_sizes),
                                                  list(input_split_sizes), True,
                                                  timeout=timeout)
        return self._work([work], [output])

    alltoall_base = all_to_all_single

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        if isinstance(input_tensors, torch.Tensor) and output_tensors and isinstance(
                output_tensors[0], torch.Tensor):  # gather(list, tensor, root) overload
            output_tensors = [output_tensors]
        t = _one(input_tensors, "gather")
        root = _root(opts)
        outs = list(output_tensors[0]) if output_tensors and self.rank() == root else []
        work = self._comm.gather(outs, t, root, True, timeout=_timeout(opts))
        return self._work([work], [outs])

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
        self._flush()
        if isinstance(output_tensors, torch.Tensor) and input_tensors and isinstance(
                input_tensors[0], torch.Tensor):  # scatter(tensor, list, root) overload
            input_tensors = [input_tensors]
        out = _one(output_tensors, "scatter")
        root = _root(opts)
        ins = list(input_tensors[0]) if input_tensors and self.rank() == root else []
        work = self._comm.scatter(out, ins, root, True, timeout=_timeout(opts))
        return self._work([work], [out])

    def barrier(self, opts: Any = None, timeout: timedelta | None = None) -> CommWork:
        self._flush()
        work = self._comm.barrier(True, timeout=_timeout(timeout if opts is None else opts))
        return self._work([work], [])

    def monitored_barrier(self, timeout: timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:
        """Rank 0 hears from every rank within ``timeout`` and names the ones it did not."""
        self._flush()
        comm, me, n = self._comm, self.rank(), self.size()
        if n == 1:
            return
        token = torch.zeros(1, dtype=torch.int32, device=self._device)
        if me != 0:
            comm.send(token, 0, timeout=timeout)
            comm.recv(token, 0, timeout=timeout)
            return
        works = {r: comm.recv(torch.zeros_like(token), r, True, timeout=timeout)
                 for r in range(1, n)}
        missing = []
        for r, work in works.items():
            try:
                work.wait()
            except Exception as exc:
                missing.append(r)
                if not wait_all_ranks:
                    raise RuntimeError(
                        f"monitored_barrier: rank {r} did not reach the barrier of group "
                        f"{self._group_name!r} within {timeout}"
                    ) from exc
        if missing:
            raise RuntimeError(f"monitored_barrier: ranks {missing} did not reach the barrier "
                               f"of group {self._group_name!r} within {timeout}")
        for r in range(1, n):
            comm.send(token, r, timeout=timeout)


def _same_length(where: str, outs: Sequence[Any], ins: Sequence[Any]) -> None:
    if len(outs) != len(ins):
        raise CommInputError(f"{where}: {len(outs)} outputs for {len(ins)} inputs; pass one "
                             f"output per input")


def _by_dtype(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault(t.dtype, []).append(t)
    return list(groups.values())


def _index_by_dtype(tensors: list[torch.Tensor]) -> list[list[int]]:
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return list(groups.values())


def _unflatten_into(flat: torch.Tensor, targets: list[torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        offset = 0
        for t in targets:
            n = t.numel()
            t.copy_(flat[offset:offset + n].view_as(t))
            offset += n

    return step


def _scatter_columns(gathered: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
    """Copy column blocks of a ``[size, total]`` gather into each ``[size * numel]`` output."""

    def step() -> None:
        offset = 0
        rows = gathered.shape[0]
        for out in outs:
            n = out.numel() // rows
            out.copy_(gathered[:, offset:offset + n].reshape(out.shape))
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


__all__ = ["_BackendWrapper"]
