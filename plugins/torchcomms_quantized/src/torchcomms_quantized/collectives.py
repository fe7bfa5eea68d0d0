"""Portable quantized all-reduce and reduce-scatter, written against the backend spec.

They run on any backend through ``all_to_all_single`` and ``all_gather_single``.

Algorithm (``quantized_all_reduce``, ``n`` ranks, blocks of ``B`` elements): pad the
flattened tensor with zeros to ``n`` chunks of whole blocks; quantize every block to
int8 with one float32 scale ``s = max|x| / 127``; exchange chunks with
``all_to_all_single`` (rank ``r`` receives chunk ``r`` of every rank, scales and payload
packed into one message); dequantize and add them in float32 in rank order (then
divide by ``n`` for AVG); re-quantize that reduced chunk; ``all_gather_single`` every
reduced chunk; dequantize and write into ``tensor``. On CPU each chunk goes in pieces of
whole blocks, pipelined so that quantizing, reducing and dequantizing overlap the
transfers; the blocks, and so the results, are the same as in one piece. Each reduced
chunk is computed by one rank only and every rank dequantizes the same gathered bytes
the same way, so the result is bit-identical on every rank. ``quantized_reduce_scatter``
is the first half.

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

from torchcomms_core.plugin import MultiWork, RedOpType, ReduceOp, ThenWork, TorchCommBackend

from . import workspace
from .quantization import Layout, padded_cols

#: Elements (of the padded float32 tensor, all rows) per pipeline piece on CPU: while one
#: piece travels, the next is quantized and the previous reduced or dequantized.
PIECE_ELEMENTS = 1 << 20
#: Most pieces a collective is cut into (each costs a few collective calls).
MAX_PIECES = 16


def piece_bounds(
    cols: int, block_size: int, rows: int, device: torch.device
) -> list[tuple[int, int]]:
    """Column ranges ``[a, b)`` of whole blocks the ``(rows, cols)`` matrix is cut into.

    One piece off CPU, where every torch op is a kernel launch anyway.
    """
    nblocks = cols // block_size
    pieces = 1
    if device.type == "cpu":
        pieces = max(1, min(MAX_PIECES, nblocks, -(-(rows * cols) // PIECE_ELEMENTS)))
    edges = [nblocks * k // pieces * block_size for k in range(pieces + 1)]
    return [(edges[k], edges[k + 1]) for k in range(pieces)]


class _Pipeline:
    """Buffers of one quantized collective: per piece, the packed messages; one shared
    float32 accumulator; all carved from one reused workspace buffer."""

    def __init__(
        self,
        backend: TorchCommBackend,
        n: int,
        cols: int,
        block_size: int,
        device: torch.device,
        gathers: bool,
        staged: int,
    ) -> None:
        self.backend = backend
        self.bounds = piece_bounds(cols, block_size, n, device)
        self.layouts = [Layout(n, b - a, block_size) for a, b in self.bounds]
        self.singles = [Layout(1, b - a, block_size) for a, b in self.bounds]
        widest = max(b - a for a, b in self.bounds)
        messages = 3 if gathers else 2
        parts = [(n * lay.width, torch.int8) for lay in self.layouts for _ in range(messages)]
        if gathers:
            parts += [(lay.width, torch.int8) for lay in self.singles]
        parts += [(widest, torch.float32), (staged, torch.float32)]
        self.buf = workspace.take(backend, workspace.Arena.size(*parts), device)
        arena = workspace.Arena(self.buf)
        shape = [(n, lay.width) for lay in self.layouts]
        self.send = [arena.tensor(n * w, torch.int8).view(n, w) for n, w in shape]
        self.recv = [arena.tensor(n * w, torch.int8).view(n, w) for n, w in shape]
        self.gathered = (
            [arena.tensor(n * w, torch.int8).view(n, w) for n, w in shape] if gathers else []
        )
        self.part = (
            [arena.tensor(lay.width, torch.int8).view(1, lay.width) for lay in self.singles]
            if gathers
            else []
        )
        self.acc = arena.tensor(widest, torch.float32)
        self.staged = arena.tensor(staged, torch.float32)

    def release(self) -> None:
        workspace.give(self.backend, self.buf)


def _wait(work: Any) -> None:
    if work is not None:
        work.wait()


def quantized_all_reduce(
    backend: TorchCommBackend,
    tensor: torch.Tensor,
    op: ReduceOp,
    async_op: bool,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
    block_size: int = 256,
    dtype: torch.dtype = torch.int8,
) -> Any:
    """All-reduce ``tensor`` in place with int8 traffic: about a quarter of float32's bytes.

    On CPU the tensor goes in pieces, pipelined: piece ``k + 1`` is quantized and sent while
    piece ``k`` is reduced, re-quantized and gathered, and piece ``k - 1`` dequantized.
    With ``async_op=True`` every all-to-all completes before this returns, and the returned
    work covers the last all-gather and the final dequantization. Issuing them later, from
    ``wait()``, would let ranks that wait at different points issue collectives in
    different orders. On GPU backends "completes" means "is ordered on the stream".
    """
    n = backend.get_size()
    numel = tensor.numel()
    if numel == 0:
        return None
    cols = padded_cols(numel, n, block_size)
    device = tensor.device
    direct = tensor.dtype == torch.float32 and tensor.is_contiguous() and numel == n * cols
    pipe = _Pipeline(backend, n, cols, block_size, device, True, 0 if direct else n * cols)
    if direct:
        x = tensor.view(n, cols)
    else:
        x = pipe.staged.view(n, cols)
        flat = pipe.staged
        flat[:numel].copy_(tensor.reshape(-1))
        flat[numel:].zero_()
    bounds = pipe.bounds
    a2a: list[Any] = [None] * len(bounds)
    gather: list[Any] = [None] * len(bounds)

    def start(k: int) -> None:
        a, b = bounds[k]
        pipe.layouts[k].quantize_into(x[:, a:b], pipe.send[k])
        a2a[k] = backend.all_to_all_single(
            pipe.recv[k].view(-1), pipe.send[k].view(-1), True, timeout=timeout, hints=hints
        )

    def reduce(k: int) -> None:
        a, b = bounds[k]
        _wait(a2a[k])
        acc = pipe.acc[: b - a]
        pipe.layouts[k].sum_rows(pipe.recv[k], acc)
        _finish_reduction(acc, op, n)
        pipe.singles[k].quantize_into(acc.view(1, b - a), pipe.part[k])
        gather[k] = backend.all_gather_single(
            pipe.gathered[k].view(-1), pipe.part[k].view(-1), True, timeout=timeout, hints=hints
        )

    def finish(k: int) -> None:
        a, b = bounds[k]
        _wait(gather[k])
        # Piece k of the input was quantized long ago: writing the result over it is safe.
        pipe.layouts[k].dequantize_into(pipe.gathered[k], x[:, a:b])

    start(0)
    for k in range(len(bounds)):
        if k + 1 < len(bounds):
            start(k + 1)
        reduce(k)
        if k:
            finish(k - 1)

    def complete() -> None:
        finish(len(bounds) - 1)
        if not direct:
            tensor.copy_(x.view(-1)[:numel].view(tensor.shape))
        # Only once every transfer is done: a failed one may still write into the buffer.
        pipe.release()

    if async_op:
        return ThenWork(_Pending(gather[-1]), complete)
    complete()
    return None


def quantized_reduce_scatter(
    backend: TorchCommBackend,
    output: torch.Tensor,
    input: torch.Tensor,
    op: ReduceOp,
    async_op: bool,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
    block_size: int = 256,
    dtype: torch.dtype = torch.int8,
) -> Any:
    """Reduce-scatter ``input`` into ``output`` with int8 all-to-alls (fully asynchronous).

    On CPU the chunks go in pieces: quantizing piece ``k + 1`` overlaps sending piece ``k``,
    and reducing each piece overlaps receiving the next.
    """
    n = backend.get_size()
    chunk = output.numel()
    if chunk == 0:
        return None
    cols = padded_cols(chunk, 1, block_size)
    device = output.device
    direct_in = input.dtype == torch.float32 and input.is_contiguous() and chunk == cols
    direct_out = output.dtype == torch.float32 and output.is_contiguous() and chunk == cols
    staged = (0 if direct_in else n * cols) + (0 if direct_out else cols)
    pipe = _Pipeline(backend, n, cols, block_size, device, False, staged)
    if direct_in:
        x = input.view(n, cols)
    else:
        x = pipe.staged[: n * cols].view(n, cols)
        x[:, :chunk].copy_(input.reshape(n, chunk))
        x[:, chunk:].zero_()
    result = output.view(-1) if direct_out else pipe.staged[staged - cols :]
    works = []
    for k, (a, b) in enumerate(pipe.bounds):
        pipe.layouts[k].quantize_into(x[:, a:b], pipe.send[k])
        works.append(
            backend.all_to_all_single(
                pipe.recv[k].view(-1), pipe.send[k].view(-1), True, timeout=timeout, hints=hints
            )
        )

    def reduce_into_output() -> None:
        for k, (a, b) in enumerate(pipe.bounds):
            _wait(works[k])
            pipe.layouts[k].sum_rows(pipe.recv[k], result[a:b])
            _finish_reduction(result[a:b], op, n)
        if not direct_out:
            output.copy_(result[:chunk].view(output.shape))
        pipe.release()

    pending = [w for w in works if w is not None]
    if async_op and pending:
        return ThenWork(MultiWork(pending), reduce_into_output)
    reduce_into_output()
    return None


class _Pending:
    """A work that may be ``None`` (already complete)."""

    __slots__ = ("_work",)

    def __init__(self, work: Any) -> None:
        self._work = work

    def wait(self) -> bool:
        _wait(self._work)
        return True

    def is_completed(self) -> bool:
        probe = getattr(self._work, "is_completed", None)
        return self._work is None or (probe is not None and bool(probe()))


def _finish_reduction(acc: torch.Tensor, op: ReduceOp, n: int) -> None:
    if op.type is RedOpType.AVG:
        # A tensor divisor: true division on every device (a Python number may become a
        # multiplication by its reciprocal on some).
        acc.div_(torch.tensor(float(n), dtype=torch.float32, device=acc.device))
