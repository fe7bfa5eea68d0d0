"""Deterministic per-rank inputs and exact references for checking collectives.

Every rank can compute every other rank's input, so each rank checks results locally.
"""

from __future__ import annotations

import torch

from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def values(rank: int, count: int, dtype: torch.dtype, salt: int = 0) -> torch.Tensor:
    """Small exact values that differ by rank and position (and fit every dtype's sums)."""
    i = torch.arange(count, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + rank + salt) % 2).to(torch.bool)
    return (1 + (i + rank + salt) % 3 + rank).to(dtype)


def product_values(rank: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """Values in {1, 2} so products over 4 ranks fit int8."""
    i = torch.arange(count, dtype=torch.int64)
    if dtype == torch.bool:
        return (i + rank) % 3 != 0
    return (1 + (i + rank) % 2).to(dtype)


def reference(inputs: list[torch.Tensor], op: ReduceOp) -> torch.Tensor:
    """Reduce per-rank inputs exactly, in a wide type, then cast back."""
    dtype = inputs[0].dtype
    t = op.type
    if dtype == torch.bool:
        stack = torch.stack(inputs)
        if t in (RedOpType.SUM, RedOpType.MAX, RedOpType.BOR):
            return stack.any(0)
        if t in (RedOpType.PRODUCT, RedOpType.MIN, RedOpType.BAND):
            return stack.all(0)
        if t is RedOpType.BXOR:
            return (stack.to(torch.int64).sum(0) % 2).bool()
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stack = torch.stack([x.to(wide) for x in inputs])
    if t is RedOpType.SUM:
        out = stack.sum(0)
    elif t is RedOpType.PRODUCT:
        out = stack.prod(0)
    elif t is RedOpType.MIN:
        out = stack.min(0).values
    elif t is RedOpType.MAX:
        out = stack.max(0).values
    elif t is RedOpType.AVG:
        out = stack.sum(0) / len(inputs)
    elif t is RedOpType.PREMUL_SUM:
        assert op.factor is not None  # ReduceOp.PREMUL_SUM always carries one
        out = (stack * float(op.factor)).sum(0)
    else:
        out = stack[0].clone()
        for x in stack[1:]:
            if t is RedOpType.BAND:
                out &= x
            elif t is RedOpType.BOR:
                out |= x
            else:
                out ^= x
    return out.to(dtype)


def ops_for(dtype: torch.dtype, native: frozenset[RedOpType] | None = None) -> list[ReduceOp]:
    """Reductions to test on ``dtype``: the backend's basic ones, plus AVG/PREMUL_SUM on floats."""
    basic = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
    if not dtype.is_floating_point:
        basic += [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR]
    ops = [op for op in basic if native is None or op.type in native]
    if dtype.is_floating_point:
        ops += [ReduceOp.AVG, ReduceOp.PREMUL_SUM(0.5)]
    return ops


def check(name: str, got: torch.Tensor, want: torch.Tensor) -> None:
    """Raise ``AssertionError`` describing where ``got`` differs from ``want`` (exactly)."""
    got, want = got.detach().cpu(), want.detach().cpu()
    if got.shape != want.shape or not torch.equal(got, want.to(got.dtype)):
        bad = (got.reshape(-1) != want.reshape(-1).to(got.dtype)).nonzero()
        raise AssertionError(
            f"{name}: result differs from the reference at {bad.numel()} positions "
            f"(first {bad[:5].flatten().tolist()}); got {got.reshape(-1)[:8].tolist()} "
            f"want {want.reshape(-1)[:8].tolist()}"
        )
