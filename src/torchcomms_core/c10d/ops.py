"""The c10d operations of the bridge: one table, one row per operation.

Each row says how a c10d call on a ``_BackendWrapper`` runs:

* **the engine lane**: when the communicator runs on a c10d engine (gloo's
  ``ProcessGroupGloo``) and nothing observes it (``TorchComm.takes_lean_calls()``: usable,
  no hooks, no call checking), c10d's own arguments go to the engine method ``engine``
  names, unchanged, and the engine's work is the result: what a plain c10d group does,
  without a second work object. ``engine_ok`` refuses the calls the engine cannot run but
  the communicator can (PREMUL_SUM on gloo), which take the general path;
* **the general path**: ``run`` converts the arguments (``c10d_args``) and issues the
  operation on the ``TorchComm``, its hooks and checks included; the result is a
  ``CommWork`` over the communicator's work;
* **profiler records**, in both: the dispatcher op's record (``record``, ``record_inputs``)
  while the call is issued, and the engine's work record (``<engine>:<work>`` with
  ``work_inputs``; ``per_input``: one per input tensor), ended on another thread when the
  work completes, as c10d's engines record them (the engine lane's engine writes its own).

``run`` functions take the group (:class:`Group`) and c10d's arguments, as c10d passes them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol

import torch

from torchcomms_core.c10d import args as a
from torchcomms_core.c10d.p2p_batch import P2PBatch, enclosing_p2p_batch
from torchcomms_core.c10d.work import CommWork
from torchcomms_core.comm import tagged
from torchcomms_core.comm.anysource import recv_anysource
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.operations.table import forwarding
from torchcomms_core.spec import unflatten_into


class Group(Protocol):
    """What a ``run`` function needs of the process group it runs for."""

    comm: TorchComm
    label: str
    coalescing: list[CommWork] | None
    pending: P2PBatch | None

    def rank(self) -> int: ...

    def size(self) -> int: ...

    def flush(self) -> None: ...

    def work(
        self,
        works: Sequence[Any],
        result: Any,
        then: Callable[[], None] | None = None,
        source_rank: int | Callable[[], int] = -1,
    ) -> CommWork: ...


@dataclasses.dataclass(frozen=True)
class BridgeOp:
    """One c10d operation of the bridge (see the module's documentation)."""

    names: tuple[str, ...]
    run: Callable[..., CommWork]
    record: str
    record_inputs: Callable[..., tuple[Any, ...]]
    work: str | Callable[..., str]
    work_inputs: Callable[..., Sequence[torch.Tensor]]
    engine: str | None = None
    engine_ok: Callable[..., bool] | None = None
    per_input: bool = False
    #: For the flight recorder in the engine lane: ``(operation, input, output)`` of a call
    #: (its one tensor each way), or ``None`` when the call is not that simple. Without
    #: it, a recorded communicator's calls take the general path, whose hooks record them.
    recorded_as: Callable[..., tuple[str, Any, Any] | None] | None = None


_SLOTS = tuple((None,) * k for k in range(8))
#: torchcomms' uneven reduce-scatter, which c10d's list form is when blocks differ.
_UNEVEN_REDUCE_SCATTER = forwarding()["reduce_scatter"]
_BARRIER_TENSORS: dict[int, torch.Tensor] = {}


def barrier_tensor(n: int) -> torch.Tensor:
    """The placeholder tensor c10d passes its barrier ops (recorded as their first input)."""
    t = _BARRIER_TENSORS.get(n)
    if t is None:
        t = _BARRIER_TENSORS[n] = torch.empty(n)
    return t


def _async(g: Group, opts: Any) -> bool:
    # Inside a coalescing block every call is issued and waited for at its end.
    return g.coalescing is not None or a.is_async(opts)


def _not_premul(*args: Any, **kwargs: Any) -> bool:
    opts = kwargs.get("opts", args[-1] if args else None)
    return not a.is_premul_sum(opts)


def _barrier_opts(opts: Any = None, timeout: Any = None) -> bool:
    # c10d's barrier(timeout=...) form is the group's; the engine takes only options.
    return timeout is None


def _rooted_not_premul(tensors: Any, opts: Any = None, op: Any = None) -> bool:
    # reduce(tensor, root, op) is c10d's C++ form; the engine takes only (tensors, opts).
    return not isinstance(opts, int) and not a.is_premul_sum(opts)


# -- point to point --------------------------------------------------------------------


def _p2p(g: Group, kind: str, tensors: Any, peer: int, tag: int) -> CommWork:
    tensor = a.one_tensor(tensors, kind)
    src = peer if kind == "recv" else -1
    ops = enclosing_p2p_batch() if g.coalescing is None else None
    if ops is None and g.coalescing is None:
        g.flush()
        comm = g.comm
        if tag:  # matched by tag, or refused where the backend cannot (never dropped)
            issue = tagged.send if kind == "send" else tagged.recv
            work = issue(comm, tensor, peer, tag, True)
        elif kind == "send":
            work = comm.send(tensor, peer, True)
        else:
            work = comm.recv(tensor, peer, True)
        return g.work([work], [tensor], source_rank=src)
    tag = tagged.check_tag(tag, kind)
    tagged.require_tags(g.comm, tag, kind)
    key = "coalescing" if ops is None else ops
    batch = g.pending
    if batch is None or batch.key is not key:
        g.flush()
        batch = g.pending = P2PBatch(g.comm, key, None if ops is None else len(ops))
    batch.add(kind, tensor, int(peer), tag)
    if batch.full:
        g.flush()
    return g.work([batch], [tensor], source_rank=src)


def _send(g: Group, tensors: Any, dstRank: int, tag: int = 0) -> CommWork:  # noqa: N803
    return _p2p(g, "send", tensors, dstRank, tag)


def _recv(g: Group, tensors: Any, srcRank: int, tag: int = 0) -> CommWork:  # noqa: N803
    return _p2p(g, "recv", tensors, srcRank, tag)


def _recv_anysource(g: Group, tensors: Any, tag: int = 0) -> CommWork:
    tensor = a.one_tensor(tensors, "recv_anysource")
    g.flush()
    work, source = recv_anysource(g.comm, tensor, True, tag=tag)
    return g.work([work], [tensor], source_rank=source)


# -- collectives -----------------------------------------------------------------------


def _broadcast(g: Group, tensors: Any, opts: Any = None) -> CommWork:
    ts = a.tensor_list(tensors, "broadcast")
    g.flush()
    root, timeout, run_async = a.root_of(opts), a.timeout_of(opts), _async(g, opts)
    return g.work([g.comm.broadcast(t, root, run_async, timeout=timeout) for t in ts], ts)


def _allreduce(g: Group, tensors: Any, opts: Any = None) -> CommWork:
    ts = a.tensor_list(tensors, "allreduce")
    if ts and ts[0].is_sparse:
        from torchcomms_core.c10d.sparse import sparse_all_reduce

        g.flush()
        output = sparse_all_reduce(g.comm, ts, a.reduce_op_of(opts), a.timeout_of(opts), g.label)
        for t in ts:  # as gloo: every input becomes the (coalesced) sum
            t.copy_(output)
        return g.work([], [output])
    g.flush()
    op, timeout, run_async = a.reduce_op_of(opts), a.timeout_of(opts), _async(g, opts)
    return g.work([g.comm.all_reduce(t, op, run_async, timeout=timeout) for t in ts], ts)


def _allreduce_coalesced(g: Group, tensors: Any, opts: Any = None) -> CommWork:
    """One all-reduce over the tensors flattened together; per-tensor results."""
    ts = a.tensor_list(tensors, "allreduce_coalesced")
    a.check_coalesced(g.label, "allreduce_coalesced", ts)
    g.flush()
    op, timeout = a.reduce_op_of(opts), a.timeout_of(opts)
    if len(ts) == 1:
        return g.work([g.comm.all_reduce(ts[0], op, True, timeout=timeout)], ts)
    flat = torch.cat([t.reshape(-1) for t in ts])
    work = g.comm.all_reduce(flat, op, True, timeout=timeout)
    return g.work([work], ts, unflatten_into(flat, ts))


def _reduce(g: Group, tensors: Any, opts: Any = None, op: Any = None) -> CommWork:
    """``reduce(tensors, ReduceOptions)`` or ``reduce(tensor, root, op)``."""
    t = a.one_tensor(tensors, "reduce")
    g.flush()
    red = a.reduce_op_of(op if isinstance(opts, int) else opts)
    run_async = _async(g, opts)
    work = g.comm.reduce(t, a.root_of(opts), red, run_async, timeout=a.timeout_of(opts))
    return g.work([work], [t])


def _allgather_lists(output_tensors: Any, input_tensors: Any) -> tuple[Any, list[torch.Tensor]]:
    if isinstance(input_tensors, torch.Tensor):  # allgather(list, tensor) overload
        output_tensors = [output_tensors]
    return output_tensors, a.tensor_list(input_tensors, "allgather")


def _allgather(g: Group, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
    outs, ins = _allgather_lists(output_tensors, input_tensors)
    g.flush()
    a.same_length("allgather", outs, ins)
    timeout = a.timeout_of(opts)
    works = [
        g.comm.all_gather(list(o), t, True, timeout=timeout) for o, t in zip(outs, ins, strict=True)
    ]
    return g.work(works, outs)


def _allgather_coalesced(
    g: Group, output_lists: Any, input_list: Any, opts: Any = None
) -> CommWork:
    """All-gathers of several tensors in one exchange; ``output_lists[rank][input]``."""
    ins = a.tensor_list(input_list, "allgather_coalesced")
    n = g.size()
    a.check_gather_coalesced(g.label, output_lists, ins, n)
    g.flush()
    flat_in = torch.cat([t.reshape(-1) for t in ins]) if len(ins) > 1 else ins[0].reshape(-1)
    flat_out = flat_in.new_empty(n * flat_in.numel())
    work = g.comm.all_gather_single(flat_out, flat_in, True, timeout=a.timeout_of(opts))
    rows = flat_out.view(n, -1)
    steps = [unflatten_into(rows[r], list(output_lists[r])) for r in range(n)]
    return g.work([work], output_lists, a.chain(steps))


def _all_gather_single(
    g: Group, output: torch.Tensor, input: torch.Tensor, opts: Any = None
) -> CommWork:
    g.flush()
    work = g.comm.all_gather_single(output, input, _async(g, opts), timeout=a.timeout_of(opts))
    return g.work([work], [output])


def _all_gather_single_coalesced(g: Group, outputs: Any, inputs: Any, opts: Any = None) -> CommWork:
    """All-gathers of several tensors, as one exchange per dtype."""
    what = "all_gather_single_coalesced"
    outs, ins = a.tensor_list(outputs, what), a.tensor_list(inputs, what)
    g.flush()
    a.same_length(what, outs, ins)
    timeout = a.timeout_of(opts)
    n = g.size()

    def one(i: int) -> Any:
        return g.comm.all_gather_single(outs[i], ins[i], True, timeout=timeout)

    def several(idx: list[int]) -> tuple[Any, Callable[[], None]]:
        a.check_sizes(what, idx, ("output", outs), ("input", ins), n)
        flat_in = torch.cat([ins[i].reshape(-1) for i in idx])
        # Flat output: engines split it into chunks shaped like the input.
        flat_out = flat_in.new_empty(n * flat_in.numel())
        work = g.comm.all_gather_single(flat_out, flat_in, True, timeout=timeout)
        return work, a.scatter_columns(flat_out.view(n, -1), [outs[i] for i in idx])

    return _per_dtype(g, ins, outs, one, several)


def _per_dtype(
    g: Group,
    ins: list[torch.Tensor],
    outs: list[torch.Tensor],
    one: Callable[[int], Any],
    several: Callable[[list[int]], tuple[Any, Callable[[], None]]],
) -> CommWork:
    """A coalesced call as one exchange per dtype of ``ins``: ``one(i)`` for a dtype only
    tensor ``i`` has, else ``several(indices)``, whose step copies the results back."""
    works, steps = [], []
    for idx in a.index_by_dtype(ins):
        if len(idx) == 1:
            works.append(one(idx[0]))
        else:
            work, step = several(idx)
            works.append(work)
            steps.append(step)
    return g.work(works, outs, a.chain(steps))


def _reduce_scatter_lists(output_tensors: Any, input_lists: Any) -> tuple[list[Any], Any]:
    if isinstance(output_tensors, torch.Tensor):  # reduce_scatter(tensor, list) overload
        input_lists = [input_lists]
    return a.tensor_list(output_tensors, "reduce_scatter"), input_lists


def _reduce_scatter(g: Group, output_tensors: Any, input_lists: Any, opts: Any = None) -> CommWork:
    outs, lists = _reduce_scatter_lists(output_tensors, input_lists)
    g.flush()
    a.same_length("reduce_scatter", outs, lists)
    op, timeout = a.reduce_op_of(opts), a.timeout_of(opts)
    works = []
    for o, ins in zip(outs, lists, strict=True):
        blocks = list(ins)
        # c10d's list form takes blocks of different sizes (gloo's reduce_scatter: block
        # r is sized for rank r's output), which is torchcomms' uneven form of it.
        uneven = any(t.numel() != o.numel() for t in blocks if isinstance(t, torch.Tensor))
        call = getattr(g.comm, _UNEVEN_REDUCE_SCATTER) if uneven else g.comm.reduce_scatter
        works.append(call(o, blocks, op, True, timeout=timeout))
    return g.work(works, outs)


def _reduce_scatter_single(
    g: Group, output: torch.Tensor, input: torch.Tensor, opts: Any = None
) -> CommWork:
    g.flush()
    work = g.comm.reduce_scatter_single(
        output, input, a.reduce_op_of(opts), _async(g, opts), timeout=a.timeout_of(opts)
    )
    return g.work([work], [output])


def _reduce_scatter_single_coalesced(
    g: Group, outputs: Any, inputs: Any, opts: Any = None
) -> CommWork:
    """Reduce-scatters of several tensors, as one exchange per dtype."""
    what = "reduce_scatter_single_coalesced"
    outs, ins = a.tensor_list(outputs, what), a.tensor_list(inputs, what)
    g.flush()
    a.same_length(what, outs, ins)
    op, timeout = a.reduce_op_of(opts), a.timeout_of(opts)
    n = g.size()

    def one(i: int) -> Any:
        return g.comm.reduce_scatter_single(outs[i], ins[i], op, True, timeout=timeout)

    def several(idx: list[int]) -> tuple[Any, Callable[[], None]]:
        a.check_sizes(what, idx, ("input", ins), ("output", outs), n)
        flat_in = torch.cat([ins[i].reshape(n, -1) for i in idx], dim=1)
        flat_out = flat_in.new_empty(flat_in.shape[1])
        work = g.comm.reduce_scatter_single(
            flat_out, flat_in.reshape(-1), op, True, timeout=timeout
        )
        return work, unflatten_into(flat_out, [outs[i] for i in idx])

    return _per_dtype(g, ins, outs, one, several)


def _alltoall(g: Group, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
    outs = a.tensor_list(output_tensors, "alltoall")
    ins = a.tensor_list(input_tensors, "alltoall")
    g.flush()
    return g.work([g.comm.all_to_all(outs, ins, True, timeout=a.timeout_of(opts))], outs)


def _all_to_all_single(
    g: Group,
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int] = (),
    input_split_sizes: Sequence[int] = (),
    opts: Any = None,
) -> CommWork:
    g.flush()
    timeout, run_async = a.timeout_of(opts), _async(g, opts)
    if (
        not output_split_sizes
        and not input_split_sizes
        and input.dim() > 0
        and input.shape[0] % g.size() == 0
    ):
        work = g.comm.all_to_all_single(output, input, run_async, timeout=timeout)
    else:
        work = g.comm.all_to_all_v_single(
            output,
            input,
            list(output_split_sizes),
            list(input_split_sizes),
            run_async,
            timeout=timeout,
        )
    return g.work([work], [output])


def _gather_lists(output_tensors: Any, input_tensors: Any) -> Any:
    if (
        isinstance(input_tensors, torch.Tensor)
        and output_tensors
        and isinstance(output_tensors[0], torch.Tensor)
    ):  # gather(list, tensor, root) overload
        return [output_tensors]
    return output_tensors


def _gather(g: Group, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
    output_tensors = _gather_lists(output_tensors, input_tensors)
    t = a.one_tensor(input_tensors, "gather")
    g.flush()
    root = a.root_of(opts)
    outs = list(output_tensors[0]) if output_tensors and g.rank() == root else []
    work = g.comm.gather(outs, t, root, True, timeout=a.timeout_of(opts))
    return g.work([work], [outs])


def _scatter_inputs(g: Group, output_tensors: Any, input_tensors: Any, opts: Any) -> list[Any]:
    if (
        isinstance(output_tensors, torch.Tensor)
        and input_tensors
        and isinstance(input_tensors[0], torch.Tensor)
    ):  # scatter(tensor, list, root) overload
        input_tensors = [input_tensors]
    root = a.root_of(opts)
    return list(input_tensors[0]) if input_tensors and g.rank() == root else []


def _scatter(g: Group, output_tensors: Any, input_tensors: Any, opts: Any = None) -> CommWork:
    out = a.one_tensor(output_tensors, "scatter")
    ins = _scatter_inputs(g, output_tensors, input_tensors, opts)
    g.flush()
    work = g.comm.scatter(out, ins, a.root_of(opts), True, timeout=a.timeout_of(opts))
    return g.work([work], [out])


def _barrier(g: Group, opts: Any = None, timeout: timedelta | None = None) -> CommWork:
    g.flush()
    work = g.comm.barrier(True, timeout=a.timeout_of(timeout if opts is None else opts))
    return g.work([work], [])


# -- what the profiler records ----------------------------------------------------------


def _tensors(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
    return a.tensor_list(args[0] if args else kwargs.get("tensors"), "profiler")


def _slots(k: int) -> Callable[..., tuple[Any, ...]]:
    slots = _SLOTS[k]
    return lambda *args, **kwargs: slots


def _two_tensors(k: int) -> Callable[..., tuple[Any, ...]]:
    slots = _SLOTS[k]
    return lambda output, input, *rest, **kwargs: (output, input, *slots)


def _input(output: torch.Tensor, input: torch.Tensor, *rest: Any, **kw: Any) -> list[torch.Tensor]:
    return [input]


def _second_list(out: Any, ins: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
    return a.tensor_list(ins, "profiler")


def _allgather_inputs(out: Any, ins: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
    return _allgather_lists(out, ins)[1]


def _reduce_scatter_inputs(out: Any, lists: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
    # Gloo runs a reduce-scatter as one all-reduce per input.
    lists = _reduce_scatter_lists(out, lists)[1]
    return list(lists[0]) if lists else []


def _gather_input(out: Any, ins: Any, *rest: Any, **kw: Any) -> list[torch.Tensor]:
    return [a.one_tensor(ins, "gather")]


def _allreduce_work(tensors: Any, *rest: Any, **kwargs: Any) -> str:
    ts = a.tensor_list(tensors, "allreduce")
    return "sparse_all_reduce" if ts and ts[0].is_sparse else "all_reduce"


def _in_place(name: str) -> Callable[..., tuple[str, Any, Any] | None]:
    def describe(tensors: Any, *rest: Any, **kwargs: Any) -> tuple[str, Any, Any] | None:
        if isinstance(tensors, list) and len(tensors) == 1:
            return name, tensors[0], tensors[0]
        return None

    describe.kind = name  # type: ignore[attr-defined]  # what the c10d-recorded lane logs
    return describe


def _out_in(name: str) -> Callable[..., tuple[str, Any, Any] | None]:
    def describe(output: Any, input: Any, *rest: Any, **kwargs: Any) -> tuple[str, Any, Any]:
        return name, input, output

    describe.kind = name  # type: ignore[attr-defined]
    return describe


def _gather_engine_ok(output_tensors: Any, *rest: Any, **kwargs: Any) -> bool:
    """Under the switch PyTorch passes ``[[]]`` as a non-root's outputs (the reference's
    wrapper wants one entry on every rank), which gloo's engine refuses ("requires empty
    output on non-root"): such calls take the general path."""
    return not (
        isinstance(output_tensors, list)
        and len(output_tensors) == 1
        and isinstance(output_tensors[0], list)
        and not output_tensors[0]
    )


def _barrier_described(*args: Any, **kwargs: Any) -> tuple[str, Any, Any]:
    return "barrier", None, None


_barrier_described.kind = "barrier"  # type: ignore[attr-defined]


def _none(*args: Any, **kwargs: Any) -> list[torch.Tensor]:
    return []


def _barrier_record(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
    return (barrier_tensor(1), *_SLOTS[4])


OPS: tuple[BridgeOp, ...] = (
    BridgeOp(("send",), _send, "c10d::send", _slots(4), "send", _tensors, engine="send"),
    BridgeOp(("recv",), _recv, "c10d::recv_", _slots(4), "recv", _tensors, engine="recv"),
    BridgeOp(
        ("recv_anysource",),
        _recv_anysource,
        "c10d::recv_any_source_",
        _slots(3),
        "recvAnySource",
        _tensors,
        engine="recv_anysource",
    ),
    BridgeOp(
        ("broadcast",),
        _broadcast,
        "c10d::broadcast_",
        _slots(6),
        "broadcast",
        _tensors,
        engine="broadcast",
        recorded_as=_in_place("broadcast"),
    ),
    BridgeOp(
        ("allreduce",),
        _allreduce,
        "c10d::allreduce_",
        _slots(6),
        _allreduce_work,
        _tensors,
        engine="allreduce",
        engine_ok=_not_premul,
        recorded_as=_in_place("all_reduce"),
    ),
    BridgeOp(
        ("allreduce_coalesced",),
        _allreduce_coalesced,
        "c10d::allreduce_coalesced_",
        _slots(5),
        "all_reduce",
        _tensors,
        engine="allreduce_coalesced",
        engine_ok=_not_premul,
    ),
    BridgeOp(
        ("reduce",),
        _reduce,
        "c10d::reduce_",
        _slots(7),
        "reduce",
        lambda tensors, *rest, **kw: [a.one_tensor(tensors, "reduce")],
        engine="reduce",
        engine_ok=_rooted_not_premul,
    ),
    BridgeOp(
        ("allgather",),
        _allgather,
        "c10d::allgather_",
        _slots(5),
        "all_gather",
        _allgather_inputs,
        engine="allgather",
    ),
    BridgeOp(
        ("allgather_coalesced",),
        _allgather_coalesced,
        "c10d::allgather_coalesced_",
        _slots(4),
        "all_gather",
        _second_list,
        engine="allgather_coalesced",
    ),
    BridgeOp(
        ("all_gather_single", "_allgather_base"),
        _all_gather_single,
        "c10d::_allgather_base_",
        _two_tensors(3),
        "all_gather",
        _input,
        engine="_allgather_base",
        recorded_as=_out_in("all_gather_single"),
    ),
    BridgeOp(
        ("all_gather_single_coalesced", "allgather_into_tensor_coalesced"),
        _all_gather_single_coalesced,
        "c10d::allgather_into_tensor_coalesced_",
        _slots(4),
        "all_gather",
        _second_list,
    ),
    BridgeOp(
        ("reduce_scatter",),
        _reduce_scatter,
        "c10d::reduce_scatter_",
        _slots(6),
        "all_reduce",
        _reduce_scatter_inputs,
        engine="reduce_scatter",
        engine_ok=_not_premul,
        per_input=True,
    ),
    BridgeOp(
        ("reduce_scatter_single", "_reduce_scatter_base"),
        _reduce_scatter_single,
        "c10d::_reduce_scatter_base_",
        _two_tensors(4),
        "all_reduce",
        _input,
        engine="_reduce_scatter_base",
        engine_ok=_not_premul,
        recorded_as=_out_in("reduce_scatter_single"),
    ),
    BridgeOp(
        ("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced"),
        _reduce_scatter_single_coalesced,
        "c10d::reduce_scatter_tensor_coalesced_",
        _slots(6),
        "all_reduce",
        _second_list,
        per_input=True,
    ),
    BridgeOp(
        ("alltoall",),
        _alltoall,
        "c10d::alltoall_",
        _slots(5),
        "all_to_all",
        _second_list,
        engine="alltoall",
    ),
    BridgeOp(
        ("all_to_all_single", "alltoall_base"),
        _all_to_all_single,
        "c10d::alltoall_base_",
        _two_tensors(5),
        "all_to_all",
        _input,
        engine="alltoall_base",
        recorded_as=_out_in("all_to_all_single"),
    ),
    BridgeOp(
        ("gather",),
        _gather,
        "c10d::gather_",
        _slots(6),
        "gather",
        _gather_input,
        engine="gather",
        engine_ok=_gather_engine_ok,
    ),
    BridgeOp(
        ("scatter",),
        _scatter,
        "c10d::scatter_",
        _slots(6),
        "scatter",
        lambda out, ins, opts=None, **kw: _scatter_record_inputs(out, ins, opts),
        engine="scatter",
    ),
    BridgeOp(
        ("barrier",),
        _barrier,
        "c10d::barrier",
        _barrier_record,
        "barrier",
        _none,
        engine="barrier",
        engine_ok=_barrier_opts,
        recorded_as=_barrier_described,
    ),
)


def _scatter_record_inputs(out: Any, ins: Any, opts: Any) -> list[torch.Tensor]:
    # Only the root passes inputs; gloo records what it was given.
    if isinstance(out, torch.Tensor) and ins and isinstance(ins[0], torch.Tensor):
        ins = [ins]
    return [t for row in (ins or []) for t in row]
