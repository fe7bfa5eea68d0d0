"""The operations ``torchcomms bench`` measures, one :class:`BenchOp` subclass each.

Adding one to ``OPS`` makes it benchmarkable; ``PLUGIN_OPS`` run when their plugin is installed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from .base import BenchOp, PairOp
from .data import (
    DTYPES,
    IN_PLACE,
    NO_BUFFERS,
    OUT_OF_PLACE,
    REDOPS,
    Buffers,
    Case,
    blocks,
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
from .transport_ops import TransportRead, TransportWrite
from .window_ops import WindowPutSignal

__all__ = [
    "DEFAULT_OPS",
    "DTYPES",
    "IN_PLACE",
    "OPS",
    "OUT_OF_PLACE",
    "PLUGIN_OPS",
    "REDOPS",
    "BenchOp",
    "Buffers",
    "Case",
    "available_ops",
    "dtype_name",
    "pattern",
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


class ReduceScatterV(_Chunked):
    """Uneven reduce-scatter: rank ``r`` receives ``r + 1`` parts of the input."""

    name = "reduce_scatter_v"
    reduces = True
    uneven = True
    listed = True
    gathers = False

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter_v(bufs.output, bufs.input_list, case.reduce_op)


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


class AllGatherV(_Chunked):
    """Uneven all-gather: rank ``r`` contributes ``r + 1`` parts of every output."""

    name = "all_gather_v"
    uneven = True
    listed = True
    gathers = True

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather_v(bufs.output_list, bufs.input)


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


class _PluginOp(_Collective):
    """A collective that a plugin adds: torch.distributed has no equivalent to compare."""

    c10d_name: ClassVar[str | None] = None

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")


class AllReduceCoalesced(_PluginOp, AllReduce):
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


class _Quantized(_PluginOp):
    """Counts elements outside the error bound torchcomms-quantized documents (its README).

    The plugin's data moves as int8 with one float32 scale per block, so results are
    approximate by design. Per element of block ``b``: ``|result - exact| <= A_b / divisor``
    for SUM (divided by ``n`` for AVG), ``A_b`` being the sum over ranks of max|x| over the
    block, plus ``flushes * 2**-100`` for blocks flushed to zero, plus the final rounding to
    bfloat16/float16: ``u * (|exact| + that)`` and, for float16 subnormals, ``2**-25``.
    Restated rather than imported (the core imports no plugin), so the bench checks the
    documented contract independently of the plugin's own code.
    """

    #: The collective's default block size, which ``run`` uses.
    block_size: ClassVar[int] = 256
    #: The ``divisor`` of the bound.
    divisor: ClassVar[int]
    #: The bound's ``flushes``: ``nranks`` plus this many.
    extra_flushes: ClassVar[int] = 0
    _FLUSH: ClassVar[float] = 2.0**-100
    _ROUNDING: ClassVar[dict[torch.dtype, tuple[float, float]]] = {
        torch.float32: (0.0, 0.0),
        torch.bfloat16: (2.0**-8, 0.0),
        torch.float16: (2.0**-11, 2.0**-25),
    }

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if dtype not in self._ROUNDING:
            return (
                f"needs a floating-point datatype (float32, bfloat16, float16), got "
                f"{dtype_name(dtype)}"
            )
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return super().refuses(dtype, redop, nranks)

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements farther from the exact result than the documented error bound."""
        flat = bufs.output.view(-1)
        n, size = case.nranks, self.block_size
        unit, tiny = self._ROUNDING[case.dtype]
        ranks = [dataclasses.replace(case, rank=r) for r in range(n)]
        # Where this rank's output lies in every rank's input. Each output is padded to
        # whole blocks, so blocks start at the output's start.
        parts = self.input_parts(bufs.count, case)
        start_in_input = 0 if parts is None else starts(parts)[case.rank]
        wrong = 0
        # BLOCK (2**20) is a multiple of the block size, so quantization blocks never straddle
        # two of these slices.
        for start, stop, index in blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            absmax_sum = torch.zeros(
                -(-(stop - start) // size), dtype=torch.float64, device=flat.device
            )
            for rank_case in ranks:
                addends = self.input_values(index + start_in_input, bufs.count, rank_case)
                addends = addends.to(torch.float64)
                exact += addends
                padded = torch.zeros(
                    absmax_sum.numel() * size, dtype=torch.float64, device=flat.device
                )
                padded[: addends.numel()] = addends.abs()
                absmax_sum += padded.view(-1, size).amax(dim=1)
            per_block = absmax_sum / self.divisor
            if case.redop == "avg":
                exact /= n
                per_block /= n
            per_block += (n + self.extra_flushes) * self._FLUSH
            quantized = per_block.repeat_interleave(size)[: stop - start]
            bound = quantized + unit * (exact.abs() + quantized) + tiny
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            # A NaN result is wrong too: compare with "not within" rather than "above".
            wrong += int((~(error <= bound)).sum())
        return wrong


class QuantizedAllReduce(_Quantized, AllReduce):
    """In place, like all_reduce, through the ``quantized_all_reduce`` plugin collective."""

    name = "quantized_all_reduce"
    divisor = 126
    extra_flushes = 1

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.quantized_all_reduce(bufs.output, case.reduce_op)


class QuantizedReduceScatter(_Quantized, ReduceScatterSingle):
    """Like reduce_scatter_single, through the ``quantized_reduce_scatter`` plugin collective.

    One int8 quantization.
    """

    name = "quantized_reduce_scatter"
    forms = (OUT_OF_PLACE,)
    divisor = 250

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.quantized_reduce_scatter(bufs.output, bufs.input, case.reduce_op)


class ReduceScatterQuantized(_PluginOp, ReduceScatterSingle):
    """Like reduce_scatter_single, through torchcomms-quantized's ``reduce_scatter_quantized``
    (the reference's: float32 in and out, bfloat16 with stochastic rounding on the wire).

    Checked against its documented bound, restated here (the core imports no plugin): per
    element, ``|result - exact| <= sum_r |x_r| * (2**-7 + n * 2**-23)`` (divided by ``n`` for
    AVG).
    """

    name = "reduce_scatter_quantized"
    forms = (OUT_OF_PLACE,)

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if dtype != torch.float32:
            return f"takes float32 tensors only (as the reference), got {dtype_name(dtype)}"
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return super().refuses(dtype, redop, nranks)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        seed = torch.tensor([case.rank], dtype=torch.int64, device=bufs.output.device)
        comm.reduce_scatter_quantized(bufs.output, bufs.input, case.reduce_op, seed)

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements farther from the exact result than the documented bound."""
        flat = bufs.output.view(-1)
        n = case.nranks
        parts = self.input_parts(bufs.count, case)
        start_in_input = 0 if parts is None else starts(parts)[case.rank]
        wrong = 0
        for start, stop, index in blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            magnitude = torch.zeros_like(exact)
            for r in range(n):
                rank_case = dataclasses.replace(case, rank=r)
                addends = self.input_values(index + start_in_input, bufs.count, rank_case)
                exact += addends.to(torch.float64)
                magnitude += addends.to(torch.float64).abs()
            bound = magnitude * (2.0**-7 + n * 2.0**-23)
            if case.redop == "avg":
                exact /= n
                bound /= n
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            wrong += int((~(error <= bound)).sum())
        return wrong


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
        AllGatherV(),
        ReduceScatterV(),
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

#: Operations over collectives that plugins add, with the distribution that provides each.
#: They are offered when the collective is installed and run only when named in ``--ops``
#: (or with ``--ops all``).
PLUGIN_OPS: dict[str, tuple[BenchOp, str]] = {
    "all_reduce_coalesced": (AllReduceCoalesced(), "torchcomms-core"),
    "quantized_all_reduce": (QuantizedAllReduce(), "torchcomms-quantized"),
    "quantized_reduce_scatter": (QuantizedReduceScatter(), "torchcomms-quantized"),
    "reduce_scatter_quantized": (ReduceScatterQuantized(), "torchcomms-quantized"),
}


def available_ops() -> dict[str, BenchOp]:
    """``OPS`` plus the ``PLUGIN_OPS`` whose collective is installed in this environment."""
    from .._plugins import list_collectives

    installed = list_collectives()
    return {**OPS, **{name: op for name, (op, _dist) in PLUGIN_OPS.items() if name in installed}}


def unknown_ops_message(names: list[str] | tuple[str, ...]) -> str | None:
    """Why some of ``names`` cannot be benchmarked here, or ``None`` when all can."""
    ops = available_ops()
    missing = [name for name in names if name not in ops]
    if not names:
        return f"no operation given; choose from {', '.join(ops)}, or all"
    if not missing:
        return None
    uninstalled = [name for name in missing if name in PLUGIN_OPS]
    if uninstalled:
        dists = sorted({PLUGIN_OPS[name][1] for name in uninstalled})
        return (
            f"operation {', '.join(map(repr, uninstalled))} is a plugin collective that is "
            f"not installed; pip install {' '.join(dists)}"
        )
    return (
        f"unknown operation {', '.join(map(repr, missing))}; choose from {', '.join(ops)}, or all"
    )
