"""Portable quantized all-reduce and reduce-scatter, written against the backend spec.

They run on any backend through ``all_to_all_single`` and ``all_gather_single``.

Algorithm (``quantized_all_reduce``, ``n`` ranks, blocks of ``B`` elements): pad the
flattened tensor with zeros to ``n`` chunks of whole blocks; quantize every block to
int8 with one float32 scale ``s = max|x| / 127``; exchange chunks with one
``all_to_all_single`` (rank ``r`` receives chunk ``r`` of every rank, scales and payload
packed into one message); dequantize and add them in float32 in rank order (then
divide by ``n`` for AVG); re-quantize that reduced chunk; ``all_gather_single`` every
reduced chunk; dequantize and write into ``tensor``. Each reduced chunk is computed by
one rank only and every rank dequantizes the same gathered bytes the same way, so the
result is bit-identical on every rank. ``quantized_reduce_scatter`` is the first half.

Error bound. Let ``A_b`` be, for block ``b``, the sum over ranks of that rank's
``max|x|`` over the block, and ``S`` the exact sum.

* Rounding to the nearest step of size ``s_r = M_r / 127`` errs by at most ``s_r / 2
  = M_r / 254`` per element, so the dequantized sum ``S'`` is within ``A_b / 254`` of
  ``S`` (first quantization).
* ``max|S'|`` over the block is at most ``A_b + A_b / 254``; re-quantizing ``S'`` errs by
  at most half its step: ``(A_b + A_b / 254) / 254`` (second quantization).
* Total: ``A_b (2/254 + 1/254**2) = 0.0078895 A_b``. Float32 rounding of the scales,
  products and the ``n - 1`` additions adds less than ``(n + 8) 2**-24 A_b``.

Documented bound, per element of block ``b`` (SUM; for AVG divide ``E_b`` by ``n``)::

    quantized_all_reduce:      E_b = A_b / 126     (covers float32 rounding for n <= 512)
    quantized_reduce_scatter:  E_b = A_b / 250     (one quantization: A_b / 254 + rounding)

With ``M_b`` the largest magnitude in the block on any rank, ``A_b <= n M_b``, so the
all-reduce error is at most ``n M_b / 126``. Blocks whose magnitude is below 2**-100 are
sent as zeros (an extra error below ``(n + 1) 2**-100``). For bfloat16 and float16
tensors, the input converts to float32 exactly and the float32 result is rounded to the
tensor's type at the end, adding ``u (|S| + E_b)`` with ``u = 2**-8`` (bfloat16) or
``2**-11`` (float16), plus ``2**-25`` for float16 subnormals; float16 results beyond
65504 become inf. A block holding inf or NaN on any rank comes out non-finite.
``bounds`` computes these bounds for tests.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core import RedOpType, ReduceOp, TorchCommBackend
from torchcomms_core.spec import then

from .quantization import Layout, padded_cols


def quantized_all_reduce(backend: TorchCommBackend, tensor: torch.Tensor, op: ReduceOp,
                         async_op: bool, *, timeout: timedelta | None = None,
                         hints: dict[str, str] | None = None, block_size: int = 256,
                         dtype: torch.dtype = torch.int8) -> Any:
    """All-reduce ``tensor`` in place with int8 traffic: about a quarter of float32's bytes.

    With ``async_op=True`` the first phase (the all-to-all and the local reduction)
    completes before this returns, and the returned work covers the all-gather and the
    final dequantization. The all-gather needs the reduced data, and issuing it later,
    from ``wait()``, would let ranks that wait at different points issue collectives in
    different orders. On GPU backends "completes" means "is ordered on the stream".
    """
    n = backend.get_size()
    numel = tensor.numel()
    if numel == 0:
        return None
    cols = padded_cols(numel, n, block_size)
    layout = Layout(n, cols, block_size)
    device = tensor.device
    send = layout.empty(device)
    layout.quantize_into(_as_float32_rows(tensor, n, cols), send)
    received = layout.empty(device)
    backend.all_to_all_single(received.view(-1), send.view(-1), False, timeout=timeout,
                              hints=hints)

    reduced = _reduce_rows(layout, received, op, n, device)
    mine = Layout(1, cols, block_size)
    part = mine.empty(device)
    mine.quantize_into(reduced.view(1, cols), part)
    gathered = layout.empty(device)
    work = backend.all_gather_single(gathered.view(-1), part.view(-1), async_op,
                                     timeout=timeout, hints=hints)

    def dequantize_into_tensor() -> None:
        direct = (tensor.dtype == torch.float32 and tensor.is_contiguous()
                  and numel == n * cols)
        values = (tensor.view(n, cols) if direct
                  else torch.empty((n, cols), dtype=torch.float32, device=device))
        layout.dequantize_all(gathered, values)
        if not direct:
            tensor.copy_(values.view(-1)[:numel].view(tensor.shape))

    return then(work, dequantize_into_tensor)


def quantized_reduce_scatter(backend: TorchCommBackend, output: torch.Tensor,
                             input: torch.Tensor, op: ReduceOp, async_op: bool, *,
                             timeout: timedelta | None = None,
                             hints: dict[str, str] | None = None, block_size: int = 256,
                             dtype: torch.dtype = torch.int8) -> Any:
    """Reduce-scatter ``input`` into ``output`` with one int8 all-to-all (fully asynchronous)."""
    n = backend.get_size()
    chunk = output.numel()
    if chunk == 0:
        return None
    cols = padded_cols(chunk, 1, block_size)
    layout = Layout(n, cols, block_size)
    device = output.device
    send = layout.empty(device)
    layout.quantize_into(_as_float32_rows(input, n, cols, chunk), send)
    received = layout.empty(device)
    work = backend.all_to_all_single(received.view(-1), send.view(-1), async_op,
                                     timeout=timeout, hints=hints)

    def reduce_into_output() -> None:
        reduced = _reduce_rows(layout, received, op, n, device)
        output.copy_(reduced[:chunk].view(output.shape))

    return then(work, reduce_into_output)


def _as_float32_rows(t: torch.Tensor, rows: int, cols: int, used: int | None = None
                     ) -> torch.Tensor:
    """``t`` as float32 ``(rows, cols)``: row ``r`` holds elements ``r*used ..`` zero-padded.

    Without ``used``, the flattened tensor fills the rows in order (then zeros).
    """
    if used is None:
        if t.dtype == torch.float32 and t.is_contiguous() and t.numel() == rows * cols:
            return t.view(rows, cols)
        flat = torch.zeros(rows * cols, dtype=torch.float32, device=t.device)
        flat[: t.numel()].copy_(t.reshape(-1))
        return flat.view(rows, cols)
    if t.dtype == torch.float32 and t.is_contiguous() and used == cols:
        return t.view(rows, cols)
    padded = torch.zeros((rows, cols), dtype=torch.float32, device=t.device)
    padded[:, :used].copy_(t.reshape(rows, used))
    return padded


def _reduce_rows(layout: Layout, received: torch.Tensor, op: ReduceOp, n: int,
                 device: torch.device) -> torch.Tensor:
    """Dequantize every received row and add them in rank order (float32); mean for AVG."""
    acc = torch.empty(layout.cols, dtype=torch.float32, device=device)
    layout.sum_rows(received, acc)
    if op.type is RedOpType.AVG:
        # A tensor divisor: true division on every device (a Python number may become a
        # multiplication by its reciprocal on some).
        acc.div_(torch.tensor(float(n), dtype=torch.float32, device=device))
    return acc
