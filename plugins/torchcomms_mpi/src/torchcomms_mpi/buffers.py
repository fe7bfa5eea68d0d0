"""Tensors as MPI buffers (no copies) and torchcomms reductions as MPI ops.

A buffer is ``[memory, count, datatype]`` over the tensor's own storage. Types MPI lacks
(bfloat16, and float16 where the library has no ``MPIX_C_FLOAT16``) travel as 16-bit
words and are reduced by user-defined MPI ops that call torch on the received blocks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from mpi4py import MPI

from torchcomms_core.plugin import RedOpType, ReduceOp, overlaps

__all__ = [
    "EMULATED",
    "MPI_TYPES",
    "blocked",
    "buf",
    "contiguous_run",
    "first",
    "mpi_op",
    "overlaps",
    "same_memory",
    "scattered",
]

_fromaddress = MPI.buffer.fromaddress


def _native_float16() -> Any:
    try:
        return MPI.Datatype.fromcode("e")  # MPIX_C_FLOAT16 in MPICH >= 4
    except (KeyError, ValueError, MPI.Exception):
        return None


_FLOAT16 = _native_float16()

#: torch dtype -> MPI datatype the data travels as. ``bool`` travels as bytes (0/1).
MPI_TYPES: dict[torch.dtype, Any] = {
    torch.float32: MPI.FLOAT,
    torch.float64: MPI.DOUBLE,
    torch.float16: _FLOAT16 if _FLOAT16 is not None else MPI.UINT16_T,
    torch.bfloat16: MPI.UINT16_T,
    torch.int8: MPI.INT8_T,
    torch.int16: MPI.INT16_T,
    torch.int32: MPI.INT32_T,
    torch.int64: MPI.INT64_T,
    torch.uint8: MPI.UINT8_T,
    torch.bool: MPI.UINT8_T,
}

_BASIC_OPS: dict[RedOpType, Any] = {
    RedOpType.SUM: MPI.SUM,
    RedOpType.PRODUCT: MPI.PROD,
    RedOpType.MIN: MPI.MIN,
    RedOpType.MAX: MPI.MAX,
    RedOpType.BAND: MPI.BAND,
    RedOpType.BOR: MPI.BOR,
    RedOpType.BXOR: MPI.BXOR,
}
# torch reduces bool as logic: SUM is "or", PRODUCT is "and"; on 0/1 bytes that is BOR/BAND.
_BOOL_OPS: dict[RedOpType, Any] = {
    **_BASIC_OPS,
    RedOpType.SUM: MPI.BOR,
    RedOpType.PRODUCT: MPI.BAND,
}

#: dtypes MPI cannot reduce natively: reduced by the user-defined ops below.
EMULATED: frozenset[torch.dtype] = frozenset(
    {torch.bfloat16} | ({torch.float16} if _FLOAT16 is None else set())
)

_TORCH_REDUCE: dict[RedOpType, Callable[[torch.Tensor, torch.Tensor], Any]] = {
    RedOpType.SUM: lambda acc, x: acc.add_(x),
    RedOpType.PRODUCT: lambda acc, x: acc.mul_(x),
    RedOpType.MIN: lambda acc, x: torch.minimum(acc, x, out=acc),
    RedOpType.MAX: lambda acc, x: torch.maximum(acc, x, out=acc),
}
_user_ops: dict[tuple[torch.dtype, RedOpType], Any] = {}


def _user_op(dtype: torch.dtype, op_type: RedOpType) -> Any:
    """A commutative MPI op that reduces 16-bit words as ``dtype`` with torch (created once)."""
    key = (dtype, op_type)
    op = _user_ops.get(key)
    if op is not None:
        return op
    step = _TORCH_REDUCE.get(op_type)
    if step is None:
        raise ValueError(f"the MPI backend cannot apply {op_type.name} to {dtype}")

    def reduce_words(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
        acc = torch.frombuffer(_writable(inoutbuf), dtype=dtype)
        step(acc, torch.frombuffer(_writable(inbuf), dtype=dtype))

    op = _user_ops[key] = MPI.Op.Create(reduce_words, commute=True)
    return op


def _writable(buf: Any) -> Any:
    # MPI hands the incoming block over read-only; torch only reads it, so a writable
    # alias of the same memory avoids torch's warning without copying.
    mem = MPI.buffer(buf)
    return _fromaddress(mem.address, mem.nbytes) if mem.readonly else mem


#: (dtype, reduction) -> MPI op for every pair MPI reduces natively: one lookup per call.
_OPS: dict[tuple[torch.dtype, RedOpType], Any] = {
    (dtype, t): (_BOOL_OPS if dtype is torch.bool else _BASIC_OPS)[t]
    for dtype in MPI_TYPES
    if dtype not in EMULATED
    for t in _BASIC_OPS
}


def mpi_op(op: ReduceOp, dtype: torch.dtype) -> Any:
    """The MPI op applying ``op`` to ``dtype`` (AVG and PREMUL_SUM arrive resolved to SUM)."""
    t = op.type
    found = _OPS.get((dtype, t))
    return found if found is not None else _user_op(dtype, t)


def buf(t: torch.Tensor) -> list[Any]:
    """``t``'s storage as an MPI buffer (contiguous CPU tensor); mpi4py derives the count."""
    return [_fromaddress(t.data_ptr(), t.nbytes), MPI_TYPES[t.dtype]]


def blocked(t: torch.Tensor) -> list[Any]:
    """``t`` as the buffer of a collective that splits it into one equal block per rank.

    mpi4py reads an explicit count as the count of one block, so none is given: it
    divides the whole buffer by the number of ranks.
    """
    return [_fromaddress(t.data_ptr(), t.numel() * t.element_size()), MPI_TYPES[t.dtype]]


def first(t: torch.Tensor, count: int) -> list[Any]:
    """The first ``count`` elements of ``t`` as an MPI buffer."""
    return [_fromaddress(t.data_ptr(), count * t.element_size()), count, MPI_TYPES[t.dtype]]


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.numel() > 0


def scattered(tensors: Sequence[torch.Tensor]) -> list[Any]:
    """Several tensors as one byte buffer with per-tensor displacements (``*v`` collectives).

    The memory between them is never touched: MPI reads or writes only at the
    displacements, so separately allocated tensors need no gathering copy.
    """
    ptrs = [t.data_ptr() for t in tensors]
    sizes = [t.numel() * t.element_size() for t in tensors]
    live = [p for p, s in zip(ptrs, sizes, strict=True) if s]
    base = min(live) if live else 0
    end = max((p + s for p, s in zip(ptrs, sizes, strict=True) if s), default=base)
    displs = [p - base if s else 0 for p, s in zip(ptrs, sizes, strict=True)]
    return [_fromaddress(base, end - base), sizes, displs, MPI.BYTE]


def contiguous_run(tensors: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The single flat tensor the ``tensors`` are back-to-back views of, if they are."""
    if not tensors:
        return None
    first = tensors[0]
    ptr = first.data_ptr()
    home = first.untyped_storage().data_ptr()
    for t in tensors:
        if t.data_ptr() != ptr or t.dtype != first.dtype or t.untyped_storage().data_ptr() != home:
            return None
        ptr += t.numel() * t.element_size()
    total = sum(t.numel() for t in tensors)
    if total == 0:
        return first.reshape(-1)
    storage = first.untyped_storage()
    base = torch.empty(0, dtype=first.dtype)
    base.set_(storage, first.storage_offset(), (total,), (1,))
    return base
