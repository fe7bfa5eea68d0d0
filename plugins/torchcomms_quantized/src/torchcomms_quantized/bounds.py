"""The documented error bounds of the quantized collectives, as functions tests can check.

The derivation is in ``collectives``' module docstring and in the plugin's README.
"""

from __future__ import annotations

import torch

from torchcomms_core.plugin import RedOpType, ReduceOp

from .constants import FLUSH_BELOW
from .quantization import padded_cols

#: Per block, |error| <= (sum over ranks of the block's max|x|) / divisor (SUM).
ALL_REDUCE_DIVISOR = 126
REDUCE_SCATTER_DIVISOR = 250

#: Output types: (unit roundoff of the final cast from float32, absolute subnormal error).
_OUTPUT_ROUNDING: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (0.0, 0.0),
    torch.bfloat16: (2.0**-8, 0.0),
    torch.float16: (2.0**-11, 2.0**-25),
}


def all_reduce_block_absmax(
    x: torch.Tensor, world_size: int, block_size: int = 256
) -> torch.Tensor:
    """max|x| of every block ``quantized_all_reduce`` forms from ``x`` (float64, 1-D)."""
    numel = x.numel()
    cols = padded_cols(numel, world_size, block_size)
    flat = torch.zeros(world_size * cols, dtype=torch.float64, device=x.device)
    flat[:numel] = x.detach().reshape(-1).to(torch.float64).abs()
    return flat.view(-1, block_size).amax(dim=1)


def reduce_scatter_block_absmax(
    input: torch.Tensor, world_size: int, block_size: int = 256
) -> torch.Tensor:
    """max|x| of every block ``quantized_reduce_scatter`` forms: ``(world_size, blocks)``.

    Row ``r`` covers the chunk of ``input`` that rank ``r`` receives.
    """
    chunk = input.numel() // world_size
    cols = padded_cols(chunk, 1, block_size)
    padded = torch.zeros((world_size, cols), dtype=torch.float64, device=input.device)
    padded[:, :chunk] = input.detach().reshape(world_size, chunk).to(torch.float64).abs()
    return padded.view(world_size, -1, block_size).amax(dim=2)


def all_reduce_error_bound(
    absmax_sum: torch.Tensor,
    exact: torch.Tensor,
    op: ReduceOp,
    world_size: int,
    dtype: torch.dtype,
    block_size: int = 256,
) -> torch.Tensor:
    """Per-element bound on ``|quantized_all_reduce(x) - exact|`` (float64, ``exact``'s shape).

    ``absmax_sum`` is the sum over ranks of :func:`all_reduce_block_absmax`; ``exact`` is
    the exact result (the sum, or the mean for AVG); ``dtype`` is the tensor's dtype.
    """
    per_block = absmax_sum.to(torch.float64) / ALL_REDUCE_DIVISOR
    return _bound(per_block, exact, op, world_size, dtype, block_size, flushes=world_size + 1)


def reduce_scatter_error_bound(
    absmax_sum: torch.Tensor,
    exact: torch.Tensor,
    op: ReduceOp,
    world_size: int,
    dtype: torch.dtype,
    block_size: int = 256,
) -> torch.Tensor:
    """Per-element bound on one rank's ``|quantized_reduce_scatter output - exact|``.

    ``absmax_sum`` is that rank's row of the sum over ranks of
    :func:`reduce_scatter_block_absmax`; ``exact`` is the exact output.
    """
    per_block = absmax_sum.to(torch.float64) / REDUCE_SCATTER_DIVISOR
    return _bound(per_block, exact, op, world_size, dtype, block_size, flushes=world_size)


def _bound(
    per_block: torch.Tensor,
    exact: torch.Tensor,
    op: ReduceOp,
    world_size: int,
    dtype: torch.dtype,
    block_size: int,
    flushes: int,
) -> torch.Tensor:
    if op.type is RedOpType.AVG:
        per_block = per_block / world_size
    per_block = per_block + flushes * FLUSH_BELOW
    quantized = per_block.repeat_interleave(block_size)[: exact.numel()].view(exact.shape)
    unit, tiny = _OUTPUT_ROUNDING[dtype]
    exact = exact.to(torch.float64)
    return quantized + unit * (exact.abs() + quantized) + tiny
