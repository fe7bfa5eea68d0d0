"""Test data of ``torchcomms bench``: what each rank puts in, and the exact results to expect.

Values are small integers, so every reduction is exact in every type and checks compare bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchcomms_core.operations.reduce_op import ReduceOp

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

#: The two ways an operation can use its buffers, as nccl-tests names its column groups.
OUT_OF_PLACE = "out-of-place"
IN_PLACE = "in-place"
#: The form of an operation without buffers (barrier).
NO_BUFFERS = "none"

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
BLOCK = 1 << 20


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
    """The tensors one operation runs on; ``count`` is the element count of the largest.

    ``input`` and ``output`` are flat; operations that take lists of tensors get views of
    them in ``input_list``/``output_list``, so filling and checking stay flat. Uneven
    operations keep their per-rank element counts in ``input_splits``/``output_splits``.
    """

    input: torch.Tensor
    output: torch.Tensor
    count: int
    form: str = OUT_OF_PLACE
    input_list: list[torch.Tensor] = field(default_factory=list)
    output_list: list[torch.Tensor] = field(default_factory=list)
    input_splits: list[int] = field(default_factory=list)
    output_splits: list[int] = field(default_factory=list)


def pattern(src: Any, chunk: Any, offset: torch.Tensor, nranks: int, span: int) -> torch.Tensor:
    """Test value of element ``offset`` of chunk ``chunk`` of rank ``src``'s input (int64).

    Values are small integers in ``[1, span]``. Within ``span``, every (rank, chunk) pair
    gets a different shift, so a chunk delivered to the wrong place or from the wrong rank
    mismatches at every element.
    """
    result: torch.Tensor = (src + nranks * chunk + offset) % span + 1
    return result


def span(case: Case, reduced: bool) -> int:
    """The largest test value, chosen so that reducing ``nranks`` of them stays exact."""
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


def values(src: Any, chunk: Any, offset: torch.Tensor, case: Case, reduced: bool) -> torch.Tensor:
    """``pattern`` in ``case.dtype``, with the span that reduced or moved data needs."""
    return pattern(src, chunk, offset, case.nranks, span(case, reduced)).to(case.dtype)


def reduce_pattern(chunk: Any, offset: torch.Tensor, case: Case) -> torch.Tensor:
    """The exact reduction over all ranks of ``pattern(rank, chunk, offset)``, in ``case.dtype``."""
    top = span(case, reduced=True)
    redop = case.redop
    acc = pattern(0, chunk, offset, case.nranks, top)
    for src in range(1, case.nranks):
        value = pattern(src, chunk, offset, case.nranks, top)
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


def blocks(numel: int, device: torch.device) -> Iterator[tuple[int, int, torch.Tensor]]:
    """``(start, stop, index)`` over ``range(numel)`` in slices of at most ``BLOCK`` elements."""
    for start in range(0, numel, BLOCK):
        stop = min(start + BLOCK, numel)
        yield start, stop, torch.arange(start, stop, dtype=torch.int64, device=device)


def fill(buf: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Write ``make(index)`` into every flat position of ``buf``."""
    flat = buf.view(-1)
    for start, stop, index in blocks(flat.numel(), flat.device):
        flat[start:stop] = make(index)


def count_wrong(buf: torch.Tensor, expected: Callable[[torch.Tensor], torch.Tensor]) -> int:
    """Elements of ``buf`` that differ from ``expected(index)``."""
    flat = buf.view(-1)
    wrong = 0
    for start, stop, index in blocks(flat.numel(), flat.device):
        wrong += int((flat[start:stop] != expected(index)).sum())
    return wrong


# -- uneven splits -------------------------------------------------------------------------


def triangle(nranks: int) -> int:
    """``1 + 2 + ... + nranks``: the granule of the uneven operations' element counts."""
    return nranks * (nranks + 1) // 2


def uneven_sizes(count: int, nranks: int) -> list[int]:
    """Rank ``r``'s share of ``count`` (a multiple of ``triangle(nranks)``): ``r + 1`` parts."""
    part = count // triangle(nranks)
    return [part * (r + 1) for r in range(nranks)]


def pair_sizes(count: int, nranks: int, src: int) -> list[int]:
    """Elements rank ``src`` sends to each rank in the uneven all-to-all.

    ``src`` sends ``1 + (src + dst) % nranks`` parts to ``dst``: every pair differs, yet
    every rank sends and receives ``count`` elements in total, so buffers stay equal.
    """
    part = count // triangle(nranks)
    return [part * (1 + (src + dst) % nranks) for dst in range(nranks)]


def starts(sizes: Sequence[int]) -> list[int]:
    """Offset of each block when blocks of ``sizes`` lie end to end."""
    out, total = [], 0
    for size in sizes:
        out.append(total)
        total += size
    return out


def locate(index: torch.Tensor, sizes: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(block, offset)`` of flat positions ``index`` in blocks of ``sizes`` laid end to end."""
    bounds = torch.tensor(starts(sizes), dtype=torch.int64, device=index.device)
    block = torch.searchsorted(bounds, index, right=True) - 1
    return block, index - bounds[block]
