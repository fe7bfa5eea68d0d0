"""What crosses between hosts in all_reduce and reduce_scatter: the hint ``global_codec``.

- ``none`` (the default): the exact data, in the tensor's type.
- ``int8``: inside each host the data is reduced exactly (in float32), only the hop between
  hosts carries block-quantized int8 (one float32 scale per block of
  :data:`CODEC_BLOCK_SIZE` elements: about a quarter of float32's bytes), and the result is
  spread exactly inside each host again. The hop runs the collectives of
  ``torchcomms-quantized`` (``quantized_all_reduce``, ``quantized_reduce_scatter``) on the
  level between hosts; install it with ``pip install torchcomms-hier[int8]``.

The codec applies to float32, bfloat16 and float16 tensors reduced with SUM or AVG in
messages above ``hier::flat_max_bytes`` (smaller ones, other types and other reductions
stay exact). Other codecs fit the same place: a name in :data:`CODECS`, what it needs
(:func:`codec_unavailable_reason`) and its hop.

Error bound, per element (what :func:`global_codec_error_bound` computes). Blocks are
runs of ``B = 256`` elements of the flattened tensor, from its first element (hier cuts
its pipeline pieces at block edges, so the blocks are those of a flat
``quantized_all_reduce``). With ``A_b`` the sum over all ``n`` ranks of that rank's
``max|x|`` over block ``b``, every element of block ``b`` of an all_reduce's result is
within ``A_b / 126`` of the exact sum (``A_b / (126 n)`` of the exact mean for AVG):

* each host's partial sums ``P_h`` are exact up to float32 rounding, at most
  ``(n - 1) 2**-24 A_b``;
* the hop between hosts is ``quantized_all_reduce`` over the hosts' ``P_h``: within
  ``0.0078895 A'_b`` with ``A'_b = sum_h max|P_h| <= A_b`` (two roundings to half an int8
  step, plus float32 rounding), which the plugin documents as ``A'_b / 126``;
* the two together stay below ``A_b / 126`` for ``n <= 512``.

reduce_scatter: blocks start at the start of each rank's output chunk, and ``A_b`` sums
over ranks the ``max|x|`` of the block in the input chunk that rank receives; the bound is
``A_b / 250`` (one quantization). Blocks whose magnitude is below ``2**-100`` are sent as
zeros (adding up to ``(n + 1) 2**-100``), and bfloat16/float16 results add their final
rounding, ``u (|exact| + bound)`` with ``u = 2**-8`` (bfloat16) or ``2**-11`` (float16),
plus ``2**-25`` for float16 subnormals (twice for AVG, whose division rounds again).
Every rank of an all_reduce receives the same bits.

May import: torch, the standard library and ``torchcomms_core.plugin``; no other module of
the plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchcomms_core.plugin import CommInputError, RedOpType, ReduceOp, TorchComm

#: The hint naming the codec of the hop between hosts.
CODEC_HINT = "global_codec"
#: No codec: exact data between hosts.
CODEC_NONE = "none"
#: Block-quantized int8 between hosts (needs torchcomms-quantized).
CODEC_INT8 = "int8"
#: Every codec hier knows.
CODECS: tuple[str, ...] = (CODEC_NONE, CODEC_INT8)
#: What to install for the int8 codec.
INT8_INSTALL = "pip install torchcomms-hier[int8] (or pip install torchcomms-quantized)"
#: Elements per quantization block of the int8 codec (the quantized plugin's default).
CODEC_BLOCK_SIZE = 256
#: Element types the codec quantizes; others cross exactly.
CODEC_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)
#: Per block, |error| <= A_b / divisor (SUM).
ALL_REDUCE_DIVISOR = 126
REDUCE_SCATTER_DIVISOR = 250
#: Blocks below this magnitude cross as zeros.
FLUSH_BELOW = 2.0**-100
#: The collectives the int8 codec runs on the level between hosts.
INT8_COLLECTIVES = ("quantized_all_reduce", "quantized_reduce_scatter")

_OUTPUT_ROUNDING: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (0.0, 0.0),
    torch.bfloat16: (2.0**-8, 0.0),
    torch.float16: (2.0**-11, 2.0**-25),
}


def parse_codec(value: str | None) -> str:
    """The codec the hint ``global_codec`` names (``none`` when unset).

    Raises:
        CommInputError: the value names no codec.
    """
    name = (value or CODEC_NONE).strip().lower()
    if name not in CODECS:
        raise CommInputError(
            f"hint {CODEC_HINT}={value!r} names no codec; use one of {', '.join(CODECS)}"
        )
    return name


def codec_unavailable_reason(codec: str) -> str | None:
    """Why ``codec`` cannot run in this process (what to install), or ``None`` when it can."""
    if codec == CODEC_NONE:
        return None
    missing = [name for name in INT8_COLLECTIVES if not callable(getattr(TorchComm, name, None))]
    if missing:
        return (
            f"hint {CODEC_HINT}={codec!r} needs the collectives {', '.join(missing)} of "
            f"torchcomms-quantized, which are not installed or not loaded: {INT8_INSTALL}, "
            f"or pass {CODEC_HINT}={CODEC_NONE!r}"
        )
    return None


def codec_applies(codec: str, dtype: torch.dtype, op: ReduceOp) -> bool:
    """Whether ``codec`` quantizes a reduction of ``dtype`` with ``op`` (else it is exact)."""
    return (
        codec != CODEC_NONE and dtype in CODEC_DTYPES and op.type in (RedOpType.SUM, RedOpType.AVG)
    )


def global_codec_error_bound(
    inputs: Sequence[torch.Tensor],
    op: ReduceOp | None = None,
    *,
    block_size: int = CODEC_BLOCK_SIZE,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per-element bound on ``|result - exact|`` of an all_reduce with ``global_codec=int8``.

    ``inputs`` holds every rank's input (any shape, one each, rank order); the result has
    their shape, in float64. ``op`` is SUM (the default) or AVG; ``dtype`` the tensors'
    type (default: that of ``inputs[0]``), for its final rounding. The derivation is in
    this module's docstring.
    """
    n = len(inputs)
    exact, absmax = _exact_and_absmax(inputs, block_size)
    per_block = absmax / ALL_REDUCE_DIVISOR
    return _bound(per_block, exact, op, n, dtype or inputs[0].dtype, block_size, n + 1)


def global_codec_reduce_scatter_error_bound(
    inputs: Sequence[torch.Tensor],
    rank: int,
    op: ReduceOp | None = None,
    *,
    block_size: int = CODEC_BLOCK_SIZE,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Per-element bound on rank ``rank``'s ``|output - exact|`` of a reduce_scatter with
    ``global_codec=int8``. ``inputs`` holds every rank's whole input (``n`` chunks each);
    the result is one chunk, flat, in float64."""
    n = len(inputs)
    chunk = inputs[0].numel() // n
    mine = [t.reshape(-1)[rank * chunk : (rank + 1) * chunk] for t in inputs]
    exact, absmax = _exact_and_absmax(mine, block_size)
    per_block = absmax / REDUCE_SCATTER_DIVISOR
    return _bound(per_block, exact, op, n, dtype or inputs[0].dtype, block_size, n + 1)


def _exact_and_absmax(
    inputs: Sequence[torch.Tensor], block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact sum (float64, the inputs' shape) and, per block, the sum of every input's
    ``max|x|`` over it."""
    shape = inputs[0].shape
    numel = inputs[0].numel()
    blocks = -(-numel // block_size)
    exact = torch.zeros(numel, dtype=torch.float64)
    absmax = torch.zeros(blocks, dtype=torch.float64)
    padded = torch.zeros(blocks * block_size, dtype=torch.float64)
    for t in inputs:
        values = t.detach().reshape(-1).to("cpu", torch.float64)
        exact += values
        padded[:numel] = values.abs()
        absmax += padded.view(blocks, block_size).amax(dim=1)
    return exact.view(shape), absmax


def _bound(
    per_block: torch.Tensor,
    exact: torch.Tensor,
    op: ReduceOp | None,
    n: int,
    dtype: torch.dtype,
    block_size: int,
    flushes: int,
) -> torch.Tensor:
    roundings = 1
    if op is not None and op.type is RedOpType.AVG:
        per_block = per_block / n
        exact = exact / n
        roundings = 2  # the sum's, then the division's (in the tensor's type)
    per_block = per_block + flushes * FLUSH_BELOW
    spread = per_block.repeat_interleave(block_size)[: exact.numel()].view(exact.shape)
    unit, tiny = _OUTPUT_ROUNDING.get(dtype, (0.0, 0.0))
    return spread + roundings * unit * (exact.abs() + spread) + roundings * tiny
