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
    triangle,
    uneven_sizes,
    values,
)
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


def _chunks(buf: torch.Tensor, nranks: int) -> list[torch.Tensor]:
    return list(buf.chunk(nranks)) if buf.numel() else []


# -- reductions ----------------------------------------------------------------------------


class AllReduce(BenchOp):
    """In place: every rank ends with the reduction of all inputs."""

    name = "all_reduce"
    reduces = True
    forms = (IN_PLACE,)
    c10d_name: ClassVar[str | None] = "all_reduce"

    def busbw_factor(self, nranks: int) -> float:
        return 2 * (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        buf = self._empty(count, case)
        return Buffers(buf, buf, count, self._form(form))

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.rank, 0, index, case, reduced=True)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return reduce_pattern(0, index, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_reduce(bufs.output, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_reduce(bufs.output, op=c10d_reduce_op(dist, case))


class Reduce(AllReduce):
    """In place at the root, which ends with the reduction of all inputs."""

    name = "reduce"
    rooted = True
    c10d_name = "reduce"

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def holds_result(self, case: Case) -> bool:
        # Other ranks' tensors are scratch space for the engine.
        return case.rank == case.root

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce(bufs.output, case.root, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.reduce(bufs.output, dst=case.root, op=c10d_reduce_op(dist, case))


class ReduceScatterSingle(BenchOp):
    """Rank ``r``'s output is the reduction of chunk ``r`` of every rank's input.

    In place, the output is rank ``r``'s chunk of its own input.
    """

    name = "reduce_scatter_single"
    reduces = True
    splits = True
    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE, IN_PLACE)
    # Recent PyTorch renamed reduce_scatter_tensor and warns on the old name.
    c10d_name: ClassVar[str | None] = "reduce_scatter_single"
    c10d_older_name: ClassVar[str | None] = "reduce_scatter_tensor"

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        form = self._form(form)
        chunk = count // case.nranks
        full = self._empty(count, case)
        if form == IN_PLACE:
            return Buffers(full, full.narrow(0, case.rank * chunk, chunk), count, form)
        return Buffers(full, self._empty(chunk, case), count, form)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(case.rank, index // chunk, index % chunk, case, reduced=True)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return reduce_pattern(case.rank, index, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter_single(bufs.output, bufs.input, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        function = self.c10d_function_name(dist)
        assert function is not None  # c10d_name is set: run_c10d runs only then
        scatter = getattr(dist, function)
        scatter(bufs.output, bufs.input, op=c10d_reduce_op(dist, case))


class ReduceScatter(ReduceScatterSingle):
    """``reduce_scatter_single`` with the input as a list of one tensor per rank."""

    name = "reduce_scatter"
    forms = (OUT_OF_PLACE,)
    c10d_name = "reduce_scatter"
    c10d_older_name = None

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        bufs = super().allocate(count, case, form)
        bufs.input_list = _chunks(bufs.input, case.nranks)
        return bufs

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter(bufs.output, bufs.input_list, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.reduce_scatter(bufs.output, bufs.input_list, op=c10d_reduce_op(dist, case))


class ReduceScatterV(BenchOp):
    """Uneven reduce-scatter: rank ``r`` receives ``r + 1`` parts of the input."""

    name = "reduce_scatter_v"
    reduces = True

    def granule(self, nranks: int) -> int:
        return triangle(nranks)

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        sizes = uneven_sizes(count, case.nranks)
        full = self._empty(count, case)
        return Buffers(full, self._empty(sizes[case.rank], case), count, self._form(form),
                       input_list=list(torch.split(full, sizes)), input_splits=sizes)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        dst, offset = locate(index, uneven_sizes(count, case.nranks))
        return values(case.rank, dst, offset, case, reduced=True)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return reduce_pattern(case.rank, index, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter_v(bufs.output, bufs.input_list, case.reduce_op)


# -- data movement -------------------------------------------------------------------------


class AllGatherSingle(BenchOp):
    """Chunk ``r`` of every rank's output is rank ``r``'s input.

    In place, the input is rank ``r``'s chunk of its own output.
    """

    name = "all_gather_single"
    splits = True
    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE, IN_PLACE)
    # Recent PyTorch renamed all_gather_into_tensor and warns on the old name.
    c10d_name: ClassVar[str | None] = "all_gather_single"
    c10d_older_name: ClassVar[str | None] = "all_gather_into_tensor"

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        form = self._form(form)
        chunk = count // case.nranks
        full = self._empty(count, case)
        if form == IN_PLACE:
            return Buffers(full.narrow(0, case.rank * chunk, chunk), full, count, form)
        return Buffers(self._empty(chunk, case), full, count, form)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.rank, 0, index, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(index // chunk, 0, index % chunk, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather_single(bufs.output, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        function = self.c10d_function_name(dist)
        assert function is not None  # c10d_name is set: run_c10d runs only then
        gather = getattr(dist, function)
        gather(bufs.output, bufs.input)


class AllGather(AllGatherSingle):
    """``all_gather_single`` with the output as a list of one tensor per rank."""

    name = "all_gather"
    forms = (OUT_OF_PLACE,)
    c10d_name = "all_gather"
    c10d_older_name = None

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        bufs = super().allocate(count, case, form)
        bufs.output_list = _chunks(bufs.output, case.nranks)
        return bufs

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather(bufs.output_list, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_gather(bufs.output_list, bufs.input)


class AllGatherV(BenchOp):
    """Uneven all-gather: rank ``r`` contributes ``r + 1`` parts of every output."""

    name = "all_gather_v"

    def granule(self, nranks: int) -> int:
        return triangle(nranks)

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        sizes = uneven_sizes(count, case.nranks)
        full = self._empty(count, case)
        return Buffers(self._empty(sizes[case.rank], case), full, count, self._form(form),
                       output_list=list(torch.split(full, sizes)), output_splits=sizes)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.rank, 0, index, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        src, offset = locate(index, uneven_sizes(count, case.nranks))
        return values(src, 0, offset, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather_v(bufs.output_list, bufs.input)


class AllToAllSingle(BenchOp):
    """Chunk ``s`` of rank ``r``'s output is chunk ``r`` of rank ``s``'s input."""

    name = "all_to_all_single"
    splits = True
    c10d_name = "all_to_all_single"

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        return Buffers(self._empty(count, case), self._empty(count, case), count,
                       self._form(form))

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(case.rank, index // chunk, index % chunk, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(index // chunk, case.rank, index % chunk, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all_single(bufs.output, bufs.input)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all_single(bufs.output, bufs.input)


class AllToAll(AllToAllSingle):
    """``all_to_all_single`` with input and output as lists of one tensor per rank."""

    name = "all_to_all"
    c10d_name = "all_to_all"

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        bufs = super().allocate(count, case, form)
        bufs.input_list = _chunks(bufs.input, case.nranks)
        bufs.output_list = _chunks(bufs.output, case.nranks)
        return bufs

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all(bufs.output_list, bufs.input_list)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all(bufs.output_list, bufs.input_list)


class AllToAllVSingle(BenchOp):
    """Uneven all-to-all: rank ``s`` sends ``1 + (s + d) % n`` parts to rank ``d``.

    Every pair exchanges a different amount, yet each rank sends and receives ``count``.
    """

    name = "all_to_all_v_single"
    c10d_name = "all_to_all_single"

    def granule(self, nranks: int) -> int:
        return triangle(nranks)

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        n = case.nranks
        return Buffers(self._empty(count, case), self._empty(count, case), count,
                       self._form(form), input_splits=pair_sizes(count, n, case.rank),
                       output_splits=[pair_sizes(count, n, src)[case.rank] for src in range(n)])

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        dst, offset = locate(index, pair_sizes(count, case.nranks, case.rank))
        return values(case.rank, dst, offset, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        n = case.nranks
        src, offset = locate(index, [pair_sizes(count, n, s)[case.rank] for s in range(n)])
        return values(src, case.rank, offset, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all_v_single(bufs.output, bufs.input, bufs.output_splits, bufs.input_splits)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.all_to_all_single(bufs.output, bufs.input, bufs.output_splits, bufs.input_splits)


# -- rooted --------------------------------------------------------------------------------


class Broadcast(BenchOp):
    """In place: every rank ends with the root's tensor."""

    name = "broadcast"
    rooted = True
    forms = (IN_PLACE,)
    c10d_name = "broadcast"

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        buf = self._empty(count, case)
        return Buffers(buf, buf, count, self._form(form))

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        # Non-roots fill their own values too, so a broadcast that never arrives is caught.
        return values(case.rank, 0, index, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.root, 0, index, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.broadcast(bufs.output, case.root)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        dist.broadcast(bufs.output, src=case.root)


class Gather(BenchOp):
    """Chunk ``r`` of the root's output list is rank ``r``'s input."""

    name = "gather"
    rooted = True
    splits = True
    c10d_name = "gather"

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        chunk = count // case.nranks
        full = self._empty(count if case.rank == case.root else 0, case)
        return Buffers(self._empty(chunk, case), full, count, self._form(form),
                       output_list=_chunks(full, case.nranks))

    def holds_result(self, case: Case) -> bool:
        return case.rank == case.root

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.rank, 0, index, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(index // chunk, 0, index % chunk, case, reduced=False)

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


class Scatter(BenchOp):
    """Rank ``r``'s output is chunk ``r`` of the root's input list."""

    name = "scatter"
    rooted = True
    splits = True
    c10d_name = "scatter"

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        chunk = count // case.nranks
        full = self._empty(count if case.rank == case.root else 0, case)
        return Buffers(full, self._empty(chunk, case), count, self._form(form),
                       input_list=_chunks(full, case.nranks))

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        return values(case.root, index // chunk, index % chunk, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.root, case.rank, index, case, reduced=False)

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
        # Rank 1 starts with its own values, so a message that never arrives is caught.
        fill(bufs.input, lambda index: values(case.rank, 0, index, case, reduced=False))
        fill(bufs.output, lambda index: values(case.rank, 0, index, case, reduced=False))
        if case.rank == 0:
            bufs.output.zero_()

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(0, 0, index, case, reduced=False)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        if case.rank == 0:
            comm.send(bufs.input, 1)
            comm.recv(bufs.output, 1)
        elif case.rank == 1:
            comm.recv(bufs.output, 0)
            comm.send(bufs.output, 0)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        if case.rank == 0:
            dist.send(bufs.input, 1)
            dist.recv(bufs.output, 1)
        elif case.rank == 1:
            dist.recv(bufs.output, 0)
            dist.send(bufs.output, 0)


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


class AllReduceCoalesced(AllReduce):
    """``all_reduce`` of the buffer as a list of tensors, through the built-in plugin."""

    name = "all_reduce_coalesced"
    #: Tensors the buffer is split into.
    tensors: ClassVar[int] = 4
    c10d_name = None

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

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")


class _QuantizedBound:
    """Counts elements outside the error bound torchcomms-quantized documents (its README).

    Per element of block ``b``: ``|result - exact| <= A_b / divisor`` for SUM (divided by
    ``n`` for AVG), ``A_b`` being the sum over ranks of max|x| over the block, plus
    ``flushes * 2**-100`` for blocks flushed to zero, plus the final rounding to
    bfloat16/float16: ``u * (|exact| + that)`` and, for float16 subnormals, ``2**-25``.
    Restated rather than imported (the core imports no plugin), so the bench checks the
    documented contract independently of the plugin's own code.
    """

    #: The collective's default block size, which ``run`` uses.
    block_size: ClassVar[int] = 256
    _FLUSH: ClassVar[float] = 2.0**-100
    _ROUNDING: ClassVar[dict[torch.dtype, tuple[float, float]]] = {
        torch.float32: (0.0, 0.0),
        torch.bfloat16: (2.0**-8, 0.0),
        torch.float16: (2.0**-11, 2.0**-25),
    }

    def _refuses(self, dtype: torch.dtype, redop: str) -> str | None:
        if dtype not in self._ROUNDING:
            return (f"needs a floating-point datatype (float32, bfloat16, float16), got "
                    f"{dtype_name(dtype)}")
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return None

    def _count_outside(self, result: torch.Tensor, case: Case, divisor: int, flushes: int,
                       inputs: Callable[[torch.Tensor, Case], torch.Tensor]) -> int:
        """Elements of ``result`` outside the bound; ``inputs(index, rank_case)`` gives a
        rank's addends of the elements at ``index``. Blocks start at index 0."""
        flat = result.view(-1)
        n, size = case.nranks, self.block_size
        unit, tiny = self._ROUNDING[case.dtype]
        ranks = [dataclasses.replace(case, rank=r) for r in range(n)]
        wrong = 0
        # BLOCK (2**20) is a multiple of the block size, so quantization blocks never straddle
        # two of these slices.
        for start, stop, index in blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            absmax_sum = torch.zeros(-(-(stop - start) // size), dtype=torch.float64,
                                     device=flat.device)
            for rank_case in ranks:
                addends = inputs(index, rank_case).to(torch.float64)
                exact += addends
                padded = torch.zeros(absmax_sum.numel() * size, dtype=torch.float64,
                                     device=flat.device)
                padded[: addends.numel()] = addends.abs()
                absmax_sum += padded.view(-1, size).amax(dim=1)
            per_block = absmax_sum / divisor
            if case.redop == "avg":
                exact /= n
                per_block /= n
            per_block += flushes * self._FLUSH
            quantized = per_block.repeat_interleave(size)[: stop - start]
            bound = quantized + unit * (exact.abs() + quantized) + tiny
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            # A NaN result is wrong too: compare with "not within" rather than "above".
            wrong += int((~(error <= bound)).sum())
        return wrong


class QuantizedAllReduce(_QuantizedBound, AllReduce):
    """In place, like all_reduce, through the ``quantized_all_reduce`` plugin collective.

    Its data moves as int8 with one float32 scale per block, so results are approximate by
    design; ``count_wrong`` counts the elements outside the plugin's documented error bound.
    """

    name = "quantized_all_reduce"
    c10d_name = None
    _DIVISOR: ClassVar[int] = 126

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        return self._refuses(dtype, redop) or super().refuses(dtype, redop, nranks)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.quantized_all_reduce(bufs.output, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements farther from the exact result than the documented error bound."""
        return self._count_outside(
            bufs.output, case, self._DIVISOR, case.nranks + 1,
            lambda index, rank_case: self.input_values(index, bufs.count, rank_case))


class QuantizedReduceScatter(_QuantizedBound, ReduceScatterSingle):
    """Like reduce_scatter_single, through the ``quantized_reduce_scatter`` plugin collective.

    One int8 quantization; ``count_wrong`` counts elements outside the documented bound.
    """

    name = "quantized_reduce_scatter"
    forms = (OUT_OF_PLACE,)
    c10d_name = None
    _DIVISOR: ClassVar[int] = 250

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        return self._refuses(dtype, redop) or super().refuses(dtype, redop, nranks)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.quantized_reduce_scatter(bufs.output, bufs.input, case.reduce_op)

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements farther from the exact result than the documented error bound."""
        offset = case.rank * (bufs.count // case.nranks)
        # Each output chunk is padded to whole blocks, so blocks start at the chunk's start.
        return self._count_outside(
            bufs.output, case, self._DIVISOR, case.nranks,
            lambda index, rank_case: self.input_values(index + offset, bufs.count, rank_case))


#: Benchmarkable operations by name; ``DEFAULT_OPS`` run when ``--ops`` is not given.
OPS: dict[str, BenchOp] = {
    op.name: op
    for op in (AllReduce(), AllGatherSingle(), ReduceScatterSingle(), AllToAllSingle(),
               Broadcast(), AllGather(), ReduceScatter(), AllGatherV(), ReduceScatterV(),
               AllToAll(), AllToAllVSingle(), Reduce(), Gather(), GatherSingle(), Scatter(),
               SendRecv(), Barrier(), WindowPutSignal())
}

#: What ``torchcomms bench`` runs by default: the collectives nccl-tests users compare first.
DEFAULT_OPS: tuple[str, ...] = ("all_reduce", "all_gather_single", "reduce_scatter_single",
                                "all_to_all_single", "broadcast")

#: Operations over collectives that plugins add, with the distribution that provides each.
#: They are offered when the collective is installed and run only when named in ``--ops``
#: (or with ``--ops all``).
PLUGIN_OPS: dict[str, tuple[BenchOp, str]] = {
    "all_reduce_coalesced": (AllReduceCoalesced(), "torchcomms-core"),
    "quantized_all_reduce": (QuantizedAllReduce(), "torchcomms-quantized"),
    "quantized_reduce_scatter": (QuantizedReduceScatter(), "torchcomms-quantized"),
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
        return (f"operation {', '.join(map(repr, uninstalled))} is a plugin collective that is "
                f"not installed; pip install {' '.join(dists)}")
    return (f"unknown operation {', '.join(map(repr, missing))}; choose from "
            f"{', '.join(ops)}, or all")
