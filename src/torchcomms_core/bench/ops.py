"""The operations ``torchcomms bench`` measures, one :class:`BenchOp` subclass each.

Adding one to ``OPS`` makes it benchmarkable; a plugin collective brings its own through
``Collective(bench=...)`` (see :func:`plugin_ops`).
"""

from __future__ import annotations

import dataclasses
import importlib
import warnings
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from torchcomms_core.bench.base import BenchOp, PairOp
from torchcomms_core.bench.data import (
    DTYPES,
    IN_PLACE,
    NO_BUFFERS,
    OUT_OF_PLACE,
    REDOPS,
    Buffers,
    Case,
    dtype_name,
    fill,
    locate,
    pair_sizes,
    pattern,
    reduce_pattern,
    starts,
    triangle,
    uneven_sizes,
    values,
)
from torchcomms_core.bench.transport_ops import TransportRead, TransportWrite
from torchcomms_core.bench.window_ops import WindowPutSignal
from torchcomms_core.operations.table import BY_NAME, REDUCE_OP, uneven_lists
from torchcomms_core.operations.table import OPS as TABLE

__all__ = [
    "DEFAULT_OPS",
    "DTYPES",
    "IN_PLACE",
    "OPS",
    "OUT_OF_PLACE",
    "REDOPS",
    "BenchOp",
    "Buffers",
    "Case",
    "PluginOp",
    "available_ops",
    "dtype_name",
    "pattern",
    "plugin_ops",
    "reduce_pattern",
    "unknown_ops_message",
]

_C10D_REDOPS = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}


def c10d_reduce_op(dist: Any, case: Case) -> Any:
    """The ``torch.distributed.ReduceOp`` of ``case.redop``."""
    return getattr(dist.ReduceOp, _C10D_REDOPS[case.redop])


def _place(
    index: torch.Tensor, sizes: list[int] | None, whole: int = 0
) -> tuple[Any, torch.Tensor]:
    """``(part, offset)`` of flat positions ``index`` in parts of ``sizes`` laid end to end.

    ``sizes`` ``None``: the buffer is a single part, numbered ``whole``.
    """
    if sizes is None:
        return whole, index
    if len(set(sizes)) == 1:
        # Equal parts: what locate gives, without a search per element.
        return index // sizes[0], index % sizes[0]
    return locate(index, sizes)


class _Collective(BenchOp):
    """An operation described by how its buffers split into one part per rank.

    A rank's input is either whole (every rank receives all of it, or its reduction) or one
    part per destination rank; its output is either whole (the root's data, or the
    reduction) or one part per source rank. Part ``d`` of rank ``s``'s input holds
    ``values(s, d, ...)`` and lands in part ``s`` of rank ``d``'s output; that gives
    ``input_values`` and ``expected_values``. Unless said otherwise, ``(n - 1) / n`` of the
    data crosses the bus.
    """

    #: Whether the result lands at the root only (the other ranks' outputs are scratch).
    to_root: ClassVar[bool] = False
    #: Whether the parts differ in size (element counts rounded to ``triangle(nranks)``).
    uneven: ClassVar[bool] = False
    #: Whether the operation takes its split buffers as lists of views of their parts.
    listed: ClassVar[bool] = False

    def granule(self, nranks: int) -> int:
        return triangle(nranks) if self.uneven else super().granule(nranks)

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def input_parts(self, count: int, case: Case) -> list[int] | None:
        """Sizes of this rank's input parts, one per destination; ``None`` when whole."""
        return None

    def output_parts(self, count: int, case: Case) -> list[int] | None:
        """Sizes of this rank's output parts, one per source; ``None`` when whole."""
        return None

    def holds_result(self, case: Case) -> bool:
        return not self.to_root or case.rank == case.root

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        dst, offset = _place(index, self.input_parts(count, case))
        return values(case.rank, dst, offset, case, reduced=self.reduces)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        # The part of each sender's input this rank receives: all of it (0), or part ``rank``.
        part = 0 if self.input_parts(count, case) is None else case.rank
        if self.reduces:
            return reduce_pattern(part, index, case)
        src, offset = _place(index, self.output_parts(count, case), whole=case.root)
        return values(src, part, offset, case, reduced=False)

    def _with_parts(self, bufs: Buffers, case: Case) -> Buffers:
        """``bufs`` with each split buffer's parts as views (``listed``), and their sizes
        when ``uneven``."""
        inputs = self.input_parts(bufs.count, case)
        outputs = self.output_parts(bufs.count, case)
        if inputs is not None:
            bufs.input_list = self._views(bufs.input, inputs)
            bufs.input_splits = inputs if self.uneven else []
        if outputs is not None:
            bufs.output_list = self._views(bufs.output, outputs)
            bufs.output_splits = outputs if self.uneven else []
        return bufs

    def _views(self, buf: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
        return list(torch.split(buf, sizes)) if self.listed and buf.numel() else []

    def _c10d(self, dist: Any) -> Callable[..., Any]:
        """The ``torch.distributed`` function named by ``c10d_function_name``."""
        function = self.c10d_function_name(dist)
        assert function is not None  # c10d_name is set: run_c10d runs only then
        result: Callable[..., Any] = getattr(dist, function)
        return result


class _ListForm(_Collective):
    """The list form of a single-tensor operation: out of place, under its own c10d name."""

    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE,)
    listed = True
    c10d_older_name: ClassVar[str | None] = None


class _InPlace(_Collective):
    """One buffer, which is input and output."""

    forms = (IN_PLACE,)

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        buf = self._empty(count, case)
        return Buffers(buf, buf, count, self._form(form))


class _Chunked(_Collective):
    """A whole buffer of ``count`` elements on one side, this rank's part on the other.

    When ``gathers``, the whole buffer is the output, one part from each source; otherwise it
    is the input, one part for each destination. Rooted operations have the whole buffer at
    the root only (elsewhere it is empty). In place, this rank's part is a view of it.
    """

    #: Whether the whole buffer is the output (otherwise the input).
    gathers: ClassVar[bool]

    def parts(self, count: int, case: Case) -> list[int]:
        """Sizes of the whole buffer's parts, one per rank."""
        if self.uneven:
            return uneven_sizes(count, case.nranks)
        return [count // case.nranks] * case.nranks

    def input_parts(self, count: int, case: Case) -> list[int] | None:
        return None if self.gathers else self.parts(count, case)

    def output_parts(self, count: int, case: Case) -> list[int] | None:
        return self.parts(count, case) if self.gathers else None

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        form = self._form(form)
        sizes = self.parts(count, case)
        whole = self._empty(count if not self.rooted or case.rank == case.root else 0, case)
        if form == IN_PLACE:
            mine = whole.narrow(0, starts(sizes)[case.rank], sizes[case.rank])
        else:
            mine = self._empty(sizes[case.rank], case)
        if self.gathers:
            return self._with_parts(Buffers(mine, whole, count, form), case)
        return self._with_parts(Buffers(whole, mine, count, form), case)


# -- reductions ----------------------------------------------------------------------------


class AllReduce(_InPlace):
    """In place: every rank ends with the reduction of all inputs."""

    name = "all_reduce"
    reduces = True
    c10d_name: ClassVar[str | None] = "all_reduce"

    def busbw_factor(self, nranks: int) -> float:
        return 2 * (nranks - 1) / nranks

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_reduce(bufs.output, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_reduce(bufs.output, op=c10d_reduce_op(dist, case))


class Reduce(AllReduce):
    """In place at the root, which ends with the reduction of all inputs."""

    name = "reduce"
    rooted = True
    # Other ranks' tensors are scratch space for the engine.
    to_root = True
    c10d_name = "reduce"

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce(bufs.output, case.root, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.reduce(bufs.output, dst=case.root, op=c10d_reduce_op(dist, case))


class ReduceScatterSingle(_Chunked):
    """Rank ``r``'s output is the reduction of chunk ``r`` of every rank's input.

    In place, the output is rank ``r``'s chunk of its own input.
    """

    name = "reduce_scatter_single"
    reduces = True
    splits = True
    gathers = False
    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE, IN_PLACE)
    # Recent PyTorch renamed reduce_scatter_tensor and warns on the old name.
    c10d_name: ClassVar[str | None] = "reduce_scatter_single"
    c10d_older_name: ClassVar[str | None] = "reduce_scatter_tensor"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter_single(bufs.output, bufs.input, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        self._c10d(dist)(bufs.output, bufs.input, op=c10d_reduce_op(dist, case))


class ReduceScatter(_ListForm, ReduceScatterSingle):
    """``reduce_scatter_single`` with the input as a list of one tensor per rank."""

    name = "reduce_scatter"
    c10d_name = "reduce_scatter"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter(bufs.output, bufs.input_list, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.reduce_scatter(bufs.output, bufs.input_list, op=c10d_reduce_op(dist, case))


# -- data movement -------------------------------------------------------------------------


class AllGatherSingle(_Chunked):
    """Chunk ``r`` of every rank's output is rank ``r``'s input.

    In place, the input is rank ``r``'s chunk of its own output.
    """

    name = "all_gather_single"
    splits = True
    gathers = True
    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE, IN_PLACE)
    # Recent PyTorch renamed all_gather_into_tensor and warns on the old name.
    c10d_name: ClassVar[str | None] = "all_gather_single"
    c10d_older_name: ClassVar[str | None] = "all_gather_into_tensor"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather_single(bufs.output, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        self._c10d(dist)(bufs.output, bufs.input)


class AllGather(_ListForm, AllGatherSingle):
    """``all_gather_single`` with the output as a list of one tensor per rank."""

    name = "all_gather"
    c10d_name = "all_gather"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather(bufs.output_list, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_gather(bufs.output_list, bufs.input)


class _UnevenList(_Chunked):
    """The uneven form of a list collective (``operations.table.uneven_lists``): the part of
    rank ``r`` holds ``r + 1`` units of the whole buffer."""

    uneven = True
    listed = True
    gathers = True

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        method = getattr(comm, self.name)
        if self.reduces:
            method(bufs.output, bufs.input_list, case.reduce_op)
        else:
            method(bufs.output_list, bufs.input)


def uneven_list_op(name: str) -> BenchOp:
    """The benchmark of the uneven list collective ``name``, read from its table row: one
    that takes a reduction scatters a whole input, one that does not gathers into a whole
    output."""
    reduces = any(p.kind == REDUCE_OP for p in BY_NAME[name].params)
    attrs = {
        "name": name,
        "reduces": reduces,
        "gathers": not reduces,
        "__doc__": _UnevenList.__doc__,
    }
    cls = type("".join(part.capitalize() for part in name.split("_")), (_UnevenList,), attrs)
    op: BenchOp = cls()
    return op


class AllToAllSingle(_Collective):
    """Chunk ``s`` of rank ``r``'s output is chunk ``r`` of rank ``s``'s input."""

    name = "all_to_all_single"
    splits = True
    c10d_name = "all_to_all_single"

    def input_parts(self, count: int, case: Case) -> list[int] | None:
        return [count // case.nranks] * case.nranks

    def output_parts(self, count: int, case: Case) -> list[int] | None:
        return self.input_parts(count, case)

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        bufs = Buffers(self._empty(count, case), self._empty(count, case), count, self._form(form))
        return self._with_parts(bufs, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all_single(bufs.output, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all_single(bufs.output, bufs.input)


class AllToAll(_ListForm, AllToAllSingle):
    """``all_to_all_single`` with input and output as lists of one tensor per rank."""

    name = "all_to_all"
    c10d_name = "all_to_all"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all(bufs.output_list, bufs.input_list)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all(bufs.output_list, bufs.input_list)


class AllToAllVSingle(AllToAllSingle):
    """Uneven all-to-all: rank ``s`` sends ``1 + (s + d) % n`` parts to rank ``d``.

    Every pair exchanges a different amount, yet each rank sends and receives ``count``.
    """

    name = "all_to_all_v_single"
    splits = False
    uneven = True

    def input_parts(self, count: int, case: Case) -> list[int] | None:
        return pair_sizes(count, case.nranks, case.rank)

    def output_parts(self, count: int, case: Case) -> list[int] | None:
        n = case.nranks
        return [pair_sizes(count, n, src)[case.rank] for src in range(n)]

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all_v_single(bufs.output, bufs.input, bufs.output_splits, bufs.input_splits)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all_single(bufs.output, bufs.input, bufs.output_splits, bufs.input_splits)


# -- rooted --------------------------------------------------------------------------------


class Broadcast(_InPlace):
    """In place: every rank ends with the root's tensor.

    Non-roots fill their own values too, so a broadcast that never arrives is caught.
    """

    name = "broadcast"
    rooted = True
    c10d_name = "broadcast"

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.broadcast(bufs.output, case.root)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.broadcast(bufs.output, src=case.root)


class Gather(_Chunked):
    """Chunk ``r`` of the root's output list is rank ``r``'s input."""

    name = "gather"
    rooted = True
    to_root = True
    splits = True
    listed = True
    gathers = True
    c10d_name = "gather"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.gather(bufs.output_list, bufs.input, case.root)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.gather(bufs.input, gather_list=bufs.output_list or None, dst=case.root)


class GatherSingle(Gather):
    """``gather`` into one output tensor at the root."""

    name = "gather_single"
    # torch.distributed gathers into a list: the chunks of the same output tensor.
    c10d_name = "gather"

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.gather_single(bufs.output, bufs.input, case.root)


class Scatter(_Chunked):
    """Rank ``r``'s output is chunk ``r`` of the root's input list."""

    name = "scatter"
    rooted = True
    splits = True
    listed = True
    gathers = False
    c10d_name = "scatter"

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        # Only the root has an input: the root's data, whichever rank asks.
        return super().input_values(index, count, dataclasses.replace(case, rank=case.root))

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.scatter(bufs.output, bufs.input_list, case.root)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.scatter(bufs.output, scatter_list=bufs.input_list or None, src=case.root)


# -- point to point and synchronisation ----------------------------------------------------


class SendRecv(PairOp):
    """Ping-pong between ranks 0 and 1: 0 sends, 1 receives and sends it back.

    A timed call is one round trip; the reported time is half of it, one message.
    """

    name = "send_recv"
    c10d_name = "send/recv"

    def fill(self, bufs: Buffers, case: Case) -> None:
        super().fill(bufs, case)
        # Rank 1 starts with its own values, so a message that never arrives is caught.
        if case.rank != 0:
            fill(bufs.output, lambda index: self.input_values(index, bufs.count, case))

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        # A communicator and torch.distributed take the same send and recv arguments.
        if case.rank == 0:
            comm.send(bufs.input, 1)
            comm.recv(bufs.output, 1)
        elif case.rank == 1:
            comm.recv(bufs.output, 0)
            comm.send(bufs.output, 0)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        self.run(dist, bufs, case)


class Barrier(BenchOp):
    """No data: the time for every rank to reach the same point."""

    name = "barrier"
    moves_data = False
    forms = (NO_BUFFERS,)
    c10d_name = "barrier"

    def busbw_factor(self, nranks: int) -> float:
        return 0.0

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        empty = self._empty(0, case)
        return Buffers(empty, empty, 0, self._form(form))

    def fill(self, bufs: Buffers, case: Case) -> None:
        pass

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        return 0

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.barrier()

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.barrier()


# -- plugin collectives --------------------------------------------------------------------


class PluginOp(_Collective):
    """A collective that a plugin adds: torch.distributed has no equivalent to compare.

    Subclass it together with the operation whose buffers and data the collective
    shares (``class Mine(PluginOp, AllReduce)``) and give ``name`` and ``run``.
    """

    c10d_name: ClassVar[str | None] = None

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")


class AllReduceCoalesced(PluginOp, AllReduce):
    """``all_reduce`` of the buffer as a list of tensors, through the built-in plugin."""

    name = "all_reduce_coalesced"
    #: Tensors the buffer is split into.
    tensors: ClassVar[int] = 4

    def granule(self, nranks: int) -> int:
        return self.tensors

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if redop == "avg":
            return "reduces with the backend's native reductions only, not --op avg"
        return super().refuses(dtype, redop, nranks)

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        bufs = super().allocate(count, case, form)
        bufs.output_list = list(bufs.output.chunk(self.tensors))
        return bufs

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_reduce_coalesced(bufs.output_list, case.reduce_op)


#: Benchmarkable operations by name; ``DEFAULT_OPS`` run when ``--ops`` is not given.
OPS: dict[str, BenchOp] = {
    op.name: op
    for op in (
        AllReduce(),
        AllGatherSingle(),
        ReduceScatterSingle(),
        AllToAllSingle(),
        Broadcast(),
        AllGather(),
        ReduceScatter(),
        *(uneven_list_op(op.name) for op in TABLE if op.name in uneven_lists()),
        AllToAll(),
        AllToAllVSingle(),
        Reduce(),
        Gather(),
        GatherSingle(),
        Scatter(),
        SendRecv(),
        Barrier(),
        WindowPutSignal(),
        TransportWrite(),
        TransportRead(),
    )
}

#: What ``torchcomms bench`` runs by default: the collectives nccl-tests users compare first.
DEFAULT_OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather_single",
    "reduce_scatter_single",
    "all_to_all_single",
    "broadcast",
)


def plugin_ops() -> dict[str, BenchOp]:
    """The benchmarks of the installed plugin collectives that declare one (``bench=``).

    A benchmark that cannot be built (its factory raises, or its ``name`` is not the
    collective's) is left out with a warning naming its provider.
    """
    from torchcomms_core.plugin_host.manager import plugin_collectives

    found: dict[str, BenchOp] = {}
    for name, coll in plugin_collectives().items():
        if coll.bench is None:
            continue
        try:
            op = _bench_op(coll.bench)
            if not isinstance(op, BenchOp):
                raise TypeError(f"bench= gave {op!r}, not a BenchOp")
            if op.name != name:
                raise ValueError(f"its BenchOp is named {op.name!r}, not {name!r}")
        except Exception as exc:  # one broken benchmark must not hide the others
            warnings.warn(
                f"torchcomms bench: the benchmark of collective {name!r} from {coll.provider} "
                f"cannot be used ({type(exc).__name__}: {exc}); fix its Collective(bench=...)",
                RuntimeWarning,
                stacklevel=2,
            )
            continue
        found[name] = op
    return found


def _bench_op(declared: Any) -> Any:
    """The ``BenchOp`` a ``Collective(bench=...)`` declares (see ``Collective.bench``)."""
    if isinstance(declared, str):
        module, _, attr = declared.partition(":")
        declared = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            declared = getattr(declared, part)
    if isinstance(declared, BenchOp):
        return declared
    return declared()


def available_ops() -> dict[str, BenchOp]:
    """``OPS`` plus the benchmarks that installed plugin collectives declare."""
    return {**OPS, **plugin_ops()}


def unknown_ops_message(names: list[str] | tuple[str, ...]) -> str | None:
    """Why some of ``names`` cannot be benchmarked here, or ``None`` when all can."""
    from torchcomms_core.plugin_host.manager import plugin_collectives

    ops = available_ops()
    missing = [name for name in names if name not in ops]
    if not names:
        return f"no operation given; choose from {', '.join(ops)}, or all"
    if not missing:
        return None
    collectives = plugin_collectives()
    without = [name for name in missing if name in collectives]
    if without:
        providers = sorted({collectives[name].provider for name in without})
        return (
            f"collective {', '.join(map(repr, without))} (from {', '.join(providers)}) declares "
            f"no benchmark; its plugin can add one with Collective(bench=...) "
            f"(docs/writing-a-collective.md)"
        )
    return (
        f"unknown operation {', '.join(map(repr, missing))}; choose from {', '.join(ops)}, or "
        f"all. A plugin collective is offered once its plugin is installed"
    )
