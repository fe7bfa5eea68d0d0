"""The operations ``torchcomms bench`` measures: buffers, test data, result check and busbw.

One :class:`BenchOp` subclass per operation; adding it to ``OPS`` makes it benchmarkable.
Operations over plugin collectives live in ``PLUGIN_OPS`` and run when the plugin is installed.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..reduce_op import ReduceOp

#: Element types by the names ``--datatype`` accepts (nccl-tests' names are aliases).
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "double": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int": torch.int32,
    "int64": torch.int64,
}

#: Reductions by the names ``--op`` accepts.
REDOPS: dict[str, ReduceOp] = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PRODUCT,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
}

# Every integer in [0, limit] is representable in the type, so test data and the exact
# result of reducing it stay below this bound and compare bit for bit.
_EXACT_LIMIT: dict[torch.dtype, int] = {
    torch.float16: 1 << 11,
    torch.bfloat16: 1 << 8,
    torch.float32: 1 << 24,
    torch.float64: 1 << 53,
    torch.int8: (1 << 7) - 1,
    torch.uint8: (1 << 8) - 1,
    torch.int32: (1 << 31) - 1,
    torch.int64: (1 << 62),
}

# Fill and check in blocks so the index and expected-value temporaries stay small next to
# the buffers themselves.
_BLOCK = 1 << 20


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Case:
    """What an operation needs to know about one rank of the run."""

    rank: int
    nranks: int
    dtype: torch.dtype
    device: torch.device
    redop: str = "sum"
    root: int = 0

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def reduce_op(self) -> ReduceOp:
        return REDOPS[self.redop]


@dataclass
class Buffers:
    """The tensors one operation runs on; ``count`` is the element count of the largest."""

    input: torch.Tensor
    output: torch.Tensor
    count: int


def pattern(src: Any, chunk: Any, offset: torch.Tensor, nranks: int, span: int) -> torch.Tensor:
    """Test value of element ``offset`` of chunk ``chunk`` of rank ``src``'s input (int64).

    Values are small integers in ``[1, span]``. Within ``span``, every (rank, chunk) pair
    gets a different shift, so a chunk delivered to the wrong place or from the wrong rank
    mismatches at every element.
    """
    return (src + nranks * chunk + offset) % span + 1


def _span(case: Case, reduced: bool) -> int:
    limit = _EXACT_LIMIT[case.dtype]
    if not reduced:
        return limit
    if case.redop == "prod":
        # Ones and twos: the product is a power of two, exact in every float type.
        return 2
    if case.redop in ("sum", "avg"):
        # nranks values of at most span sum to at most limit, in any order.
        return max(1, limit // case.nranks)
    return limit


def reduce_pattern(chunk: Any, offset: torch.Tensor, case: Case) -> torch.Tensor:
    """The exact reduction over all ranks of ``pattern(rank, chunk, offset)``, in ``case.dtype``."""
    span = _span(case, reduced=True)
    redop = case.redop
    acc = pattern(0, chunk, offset, case.nranks, span)
    for src in range(1, case.nranks):
        value = pattern(src, chunk, offset, case.nranks, span)
        if redop in ("sum", "avg"):
            acc += value
        elif redop == "prod":
            acc *= value
        elif redop == "min":
            acc = torch.minimum(acc, value)
        elif redop == "max":
            acc = torch.maximum(acc, value)
        else:
            raise ValueError(f"no reference reduction for --op {redop!r}")
    result = acc.to(case.dtype)
    if redop == "avg":
        # Divide in the element type, as the communicator does, so rounding matches.
        result.div_(case.nranks)
    return result


def _blocks(numel: int, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
    for start in range(0, numel, _BLOCK):
        stop = min(start + _BLOCK, numel)
        yield start, stop, torch.arange(start, stop, dtype=torch.int64, device=device)


def _fill(buf: torch.Tensor, values: Callable[[torch.Tensor], torch.Tensor]) -> None:
    flat = buf.view(-1)
    for start, stop, index in _blocks(flat.numel(), flat.device):
        flat[start:stop] = values(index)


def _count_wrong(buf: torch.Tensor, expected: Callable[[torch.Tensor], torch.Tensor]) -> int:
    flat = buf.view(-1)
    wrong = 0
    for start, stop, index in _blocks(flat.numel(), flat.device):
        wrong += int((flat[start:stop] != expected(index)).sum())
    return wrong


class BenchOp(abc.ABC):
    """One benchmarked operation.

    Subclasses say how to size and allocate buffers, what each rank puts in its input
    (``input_values``), what its output must then hold (``expected_values``), how to run
    the operation and its bus-bandwidth factor. Values are indexed by flat element index.
    """

    #: Name used by ``--ops`` and in the report.
    name: ClassVar[str]
    #: Whether the operation reduces (takes ``--op``); the report shows the redop.
    reduces: ClassVar[bool] = False
    #: Whether the operation has a root (takes ``--root``); the report shows it.
    rooted: ClassVar[bool] = False
    #: Whether buffers are split into one chunk per rank (count rounded to ``nranks``).
    splits: ClassVar[bool] = False

    def count(self, nbytes: int, case: Case) -> int:
        """Elements of the largest buffer for a requested size of ``nbytes``."""
        count = nbytes // case.itemsize
        if self.splits:
            return max(count - count % case.nranks, case.nranks)
        return max(count, 1)

    @abc.abstractmethod
    def busbw_factor(self, nranks: int) -> float:
        """Bus bandwidth / algorithm bandwidth: the share of data that crosses the bus."""

    @abc.abstractmethod
    def allocate(self, count: int, case: Case) -> Buffers:
        """Allocate the buffers for ``count`` elements in the largest buffer."""

    @abc.abstractmethod
    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        """This rank's input at flat positions ``index``, in ``case.dtype``."""

    @abc.abstractmethod
    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        """This rank's output at flat positions ``index`` after one run, in ``case.dtype``."""

    @abc.abstractmethod
    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        """Run the operation once, to completion, on ``comm``."""

    def fill(self, bufs: Buffers, case: Case) -> None:
        """Write this rank's test data into the input buffer."""
        _fill(bufs.input, lambda index: self.input_values(index, bufs.count, case))

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements of this rank's output that differ from the exact expected result."""
        return _count_wrong(bufs.output,
                            lambda index: self.expected_values(index, bufs.count, case))

    def refuses(self, dtype: torch.dtype, redop: str) -> str | None:
        """Why this operation cannot run with ``dtype`` and ``redop``, or ``None`` if it can."""
        return None

    def root_label(self, case: Case) -> int:
        return case.root if self.rooted else -1

    def redop_label(self, case: Case) -> str:
        return case.redop if self.reduces else "none"

    def _empty(self, numel: int, case: Case) -> torch.Tensor:
        return torch.empty(numel, dtype=case.dtype, device=case.device)


class AllReduce(BenchOp):
    """In place: every rank ends with the reduction of all inputs."""

    name = "all_reduce"
    reduces = True

    def busbw_factor(self, nranks: int) -> float:
        return 2 * (nranks - 1) / nranks

    def allocate(self, count: int, case: Case) -> Buffers:
        buf = self._empty(count, case)
        return Buffers(buf, buf, count)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return pattern(case.rank, 0, index, case.nranks, _span(case, True)).to(case.dtype)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return reduce_pattern(0, index, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_reduce(bufs.output, case.reduce_op)


class AllGatherSingle(BenchOp):
    """Chunk ``r`` of every rank's output is rank ``r``'s input."""

    name = "all_gather_single"
    splits = True

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case) -> Buffers:
        return Buffers(self._empty(count // case.nranks, case), self._empty(count, case), count)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return pattern(case.rank, 0, index, case.nranks, _span(case, False)).to(case.dtype)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        src, offset = index // chunk, index % chunk
        return pattern(src, 0, offset, case.nranks, _span(case, False)).to(case.dtype)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_gather_single(bufs.output, bufs.input)


class ReduceScatterSingle(BenchOp):
    """Rank ``r``'s output is the reduction of chunk ``r`` of every rank's input."""

    name = "reduce_scatter_single"
    reduces = True
    splits = True

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case) -> Buffers:
        return Buffers(self._empty(count, case), self._empty(count // case.nranks, case), count)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        dst, offset = index // chunk, index % chunk
        return pattern(case.rank, dst, offset, case.nranks, _span(case, True)).to(case.dtype)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return reduce_pattern(case.rank, index, case)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.reduce_scatter_single(bufs.output, bufs.input, case.reduce_op)


class AllToAllSingle(BenchOp):
    """Chunk ``s`` of rank ``r``'s output is chunk ``r`` of rank ``s``'s input."""

    name = "all_to_all_single"
    splits = True

    def busbw_factor(self, nranks: int) -> float:
        return (nranks - 1) / nranks

    def allocate(self, count: int, case: Case) -> Buffers:
        return Buffers(self._empty(count, case), self._empty(count, case), count)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        dst, offset = index // chunk, index % chunk
        return pattern(case.rank, dst, offset, case.nranks, _span(case, False)).to(case.dtype)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        chunk = count // case.nranks
        src, offset = index // chunk, index % chunk
        return pattern(src, case.rank, offset, case.nranks, _span(case, False)).to(case.dtype)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.all_to_all_single(bufs.output, bufs.input)


class Broadcast(BenchOp):
    """In place: every rank ends with the root's tensor."""

    name = "broadcast"
    rooted = True

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def allocate(self, count: int, case: Case) -> Buffers:
        buf = self._empty(count, case)
        return Buffers(buf, buf, count)

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        # Non-roots fill their own values too, so a broadcast that never arrives is caught.
        return pattern(case.rank, 0, index, case.nranks, _span(case, False)).to(case.dtype)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return pattern(case.root, 0, index, case.nranks, _span(case, False)).to(case.dtype)

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.broadcast(bufs.output, case.root)


class QuantizedAllReduce(AllReduce):
    """In place, like all_reduce, through the ``quantized_all_reduce`` plugin collective.

    Its data moves as int8 with one float32 scale per block, so results are approximate by
    design; ``count_wrong`` counts the elements outside the plugin's documented error bound.
    """

    name = "quantized_all_reduce"
    #: The collective's default block size, which ``run`` uses.
    block_size: ClassVar[int] = 256
    # The bound torchcomms-quantized documents (its README): per element of block b,
    # |result - exact| <= A_b / 126 for SUM (A_b / (126 n) for AVG), A_b being the sum over
    # ranks of max|x| over the block, plus (n + 1) * 2**-100 for blocks flushed to zero,
    # plus the final rounding to bfloat16/float16: u * (|exact| + that) and, for float16
    # subnormals, 2**-25. Restated rather than imported (the core imports no plugin), so
    # the bench checks the documented contract independently of the plugin's own code.
    _DIVISOR: ClassVar[int] = 126
    _FLUSH: ClassVar[float] = 2.0**-100
    _ROUNDING: ClassVar[dict[torch.dtype, tuple[float, float]]] = {
        torch.float32: (0.0, 0.0),
        torch.bfloat16: (2.0**-8, 0.0),
        torch.float16: (2.0**-11, 2.0**-25),
    }

    def refuses(self, dtype: torch.dtype, redop: str) -> str | None:
        if dtype not in self._ROUNDING:
            return (f"needs a floating-point datatype (float32, bfloat16, float16), got "
                    f"{dtype_name(dtype)}")
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return None

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        comm.quantized_all_reduce(bufs.output, case.reduce_op)

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements farther from the exact result than the documented error bound."""
        flat = bufs.output.view(-1)
        n, size = case.nranks, self.block_size
        unit, tiny = self._ROUNDING[case.dtype]
        ranks = [dataclasses.replace(case, rank=r) for r in range(n)]
        wrong = 0
        # _BLOCK is a multiple of the block size, so quantization blocks never straddle
        # two of these slices.
        for start, stop, index in _blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            absmax_sum = torch.zeros(-(-(stop - start) // size), dtype=torch.float64,
                                     device=flat.device)
            for rank_case in ranks:
                values = self.input_values(index, bufs.count, rank_case).to(torch.float64)
                exact += values
                padded = torch.zeros(absmax_sum.numel() * size, dtype=torch.float64,
                                     device=flat.device)
                padded[: values.numel()] = values.abs()
                absmax_sum += padded.view(-1, size).amax(dim=1)
            per_block = absmax_sum / self._DIVISOR
            if case.redop == "avg":
                exact /= n
                per_block /= n
            per_block += (n + 1) * self._FLUSH
            quantized = per_block.repeat_interleave(size)[: stop - start]
            bound = quantized + unit * (exact.abs() + quantized) + tiny
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            # A NaN result is wrong too: compare with "not within" rather than "above".
            wrong += int((~(error <= bound)).sum())
        return wrong


#: Benchmarkable operations by name, in the order ``torchcomms bench`` runs them by default.
OPS: dict[str, BenchOp] = {
    op.name: op
    for op in (AllReduce(), AllGatherSingle(), ReduceScatterSingle(), AllToAllSingle(),
               Broadcast())
}

#: Operations over collectives that plugins add, with the distribution that provides each.
#: They are offered when the collective is installed and run only when named in ``--ops``.
PLUGIN_OPS: dict[str, tuple[BenchOp, str]] = {
    "quantized_all_reduce": (QuantizedAllReduce(), "torchcomms-quantized"),
}


def available_ops() -> dict[str, BenchOp]:
    """``OPS`` plus the ``PLUGIN_OPS`` whose collective is installed in this environment."""
    from ..plugins import list_collectives

    installed = list_collectives()
    return {**OPS, **{name: op for name, (op, _dist) in PLUGIN_OPS.items() if name in installed}}


def unknown_ops_message(names: list[str] | tuple[str, ...]) -> str | None:
    """Why some of ``names`` cannot be benchmarked here, or ``None`` when all can."""
    ops = available_ops()
    missing = [name for name in names if name not in ops]
    if not names:
        return f"no operation given; choose from {', '.join(ops)}"
    if not missing:
        return None
    uninstalled = [name for name in missing if name in PLUGIN_OPS]
    if uninstalled:
        dists = sorted({PLUGIN_OPS[name][1] for name in uninstalled})
        return (f"operation {', '.join(map(repr, uninstalled))} is a plugin collective that is "
                f"not installed; pip install {' '.join(dists)}")
    return f"unknown operation {', '.join(map(repr, missing))}; choose from {', '.join(ops)}"
