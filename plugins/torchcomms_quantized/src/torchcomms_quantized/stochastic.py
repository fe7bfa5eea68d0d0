"""``reduce_scatter_quantized``: the reference's NCCLX reduce-scatter with bfloat16 traffic.

The reference (``TorchCommNCCLX.reduce_scatter_quantized(output, input, op, seed,
async_op)``) takes float32 tensors, sends bfloat16 values rounded stochastically with a
seed, and reduces them (SUM or AVG) in float32. This is a portable implementation of the
same contract for every backend that can send bfloat16 tensors:

1. Each rank rounds its float32 ``input`` to bfloat16 stochastically (:func:`round_bf16`):
   a value between two neighbouring bfloat16 numbers ``lo < x < hi`` becomes ``hi`` with
   probability ``(x - lo) / (hi - lo)``, else ``lo``, so the rounded value's expectation is
   ``x`` (unbiased) and its error is below one bfloat16 step (``|x| * 2**-7``).
   Exactly representable values, infinities and NaN are kept as they are.
2. ``all_to_all_single`` sends chunk ``r`` of every rank to rank ``r`` (half the bytes of
   float32).
3. Rank ``r`` adds the ``n`` bfloat16 chunks in float32, in rank order, into ``output``
   (divided by ``n`` for AVG).

Determinism: the random bits of element ``i`` of rank ``r``'s input come from a generator
seeded with ``(seed, r)`` only, and the sum runs in a fixed order, so equal inputs and
seeds give bit-identical outputs on every run and whatever the timing; the rounding of
different ranks is independent (the same ``seed`` on every rank, as the reference's test
passes, does not correlate their errors). The stream is ``torch.Generator``'s for the
tensor's device, so CPU and CUDA runs of one seed round differently (each unbiased).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import RedOpType, ReduceOp, ThenWork, TorchCommBackend

#: The low 16 bits of a float32 that bfloat16 drops.
_LOW_BITS = 1 << 16
#: Keeps the high 16 bits of a float32 pattern held in an int32 (0xFFFF0000).
_HIGH_MASK = -_LOW_BITS
_MASK64 = (1 << 64) - 1


def stream_seed(seed: int, rank: int) -> int:
    """The generator seed for ``rank``'s rounding under ``seed``: a 64-bit mix of both
    (splitmix64), so nearby seeds and ranks give unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + (rank + 1) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def round_bf16(x: torch.Tensor, seed: int, rank: int = 0) -> torch.Tensor:
    """``x`` (float32) rounded stochastically to bfloat16, reproducibly for ``(seed, rank)``.

    Adding a uniform 16-bit integer to the float32 bit pattern and dropping the low 16 bits
    rounds the magnitude up with probability ``low bits / 2**16``: exactly the distance to
    the lower bfloat16 neighbour over the step, so the result is unbiased. A carry into the
    exponent is the next binade's first value, as it should be; a finite value above
    bfloat16's largest may round up to infinity, as nearest rounding would.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"round_bf16: x must be float32, got {x.dtype}")
    x = x.contiguous()
    gen = torch.Generator(device=x.device)
    gen.manual_seed(stream_seed(seed, rank))
    # One 32-bit draw gives two 16-bit noises: half the generator's work. As int16 each is
    # v in [-32768, 32767]; v + 32768 is uniform over [0, 65536).
    words = torch.empty((x.numel() + 1) // 2, dtype=torch.int32, device=x.device)
    words.random_(-(1 << 31), 1 << 31, generator=gen)
    noise = words.view(torch.int16)[: x.numel()].view(x.shape)
    bits = x.view(torch.int32).add(_LOW_BITS // 2)
    rounded = bits.add_(noise).bitwise_and_(_HIGH_MASK).view(torch.float32)
    # Infinities stay (their low bits are zero: no carry); a NaN whose payload sits in the
    # low bits could become an infinity, so NaNs are put back. A NaN anywhere makes the sum
    # NaN: one cheap reduction decides whether the NaN pass is needed.
    if bool(torch.isnan(x.sum())) and bool(torch.isnan(x).any()):
        rounded = torch.where(torch.isnan(x), x, rounded)
    return rounded.to(torch.bfloat16)  # exact: the low 16 bits are zero


def reduce_scatter_quantized(
    backend: TorchCommBackend,
    output: torch.Tensor,
    input: torch.Tensor,
    op: ReduceOp,
    seed: torch.Tensor,
    async_op: bool,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
) -> Any:
    """Reduce-scatter float32 ``input`` into ``output`` with stochastically rounded
    bfloat16 traffic (see the module docstring); asynchronous when ``async_op``."""
    n = backend.get_size()
    rank = backend.get_rank()
    chunk = output.numel()
    if chunk == 0:
        return None
    rounded = round_bf16(input.view(n, chunk), int(seed.item()), rank)
    received = torch.empty_like(rounded)
    work = backend.all_to_all_single(
        received.view(-1), rounded.view(-1), True, timeout=timeout, hints=hints
    )

    def reduce_into_output() -> None:
        if work is not None:
            work.wait()
        out = output.view(chunk)
        out.copy_(received[0])
        row = torch.empty_like(out)  # float32 + float32 adds: far faster than mixed types
        for r in range(1, n):  # rank order: the same bits on every run
            out.add_(row.copy_(received[r]))
        if op.type is RedOpType.AVG:
            out.div_(torch.tensor(float(n), dtype=torch.float32, device=out.device))

    if async_op and work is not None:
        return ThenWork(work, reduce_into_output)
    reduce_into_output()
    return None
