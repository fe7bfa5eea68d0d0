"""Block-wise symmetric int8 quantization (one float32 scale per block) and its wire layout.

Torch ops run everywhere; CUDA tensors use the fused CuPy kernels when CuPy is installed.
"""

from __future__ import annotations

import dataclasses

import torch

from . import cuda_kernels
from .constants import CPU_SLICE
from .constants import FLUSH_BELOW as FLUSH_BELOW  # re-exported (the numbers live there)
from .constants import QMAX as QMAX


def quantize_blocks(
    x: torch.Tensor,
    block_size: int,
    *,
    q_out: torch.Tensor | None = None,
    scales_out: torch.Tensor | None = None,
    fused: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize float32 ``x`` in blocks of ``block_size`` along its last dimension.

    Per block: ``scale = max|x| / 127`` and ``q = round(x / scale)`` (to nearest, ties
    to even), so ``|x - q * scale| <= scale / 2``. An all-zero block gets scale 0 and
    q 0. A block holding inf or NaN gets a non-finite scale, so it dequantizes to
    non-finite values rather than hiding them.

    ``x.shape[-1]`` must be a multiple of ``block_size``. Returns ``(q, scales)``: int8
    of ``x``'s shape and float32 of shape ``x.shape[:-1] + (x.shape[-1] // block_size,)``,
    written into ``q_out``/``scales_out`` when given (strided views are fine as long as
    the last dimension is contiguous). ``fused=None`` uses the CuPy kernel for CUDA
    tensors when CuPy imports; ``True`` requires it, ``False`` forces torch ops.
    """
    rows, nblocks = _check_blocks(x, block_size, "x")
    if x.dtype != torch.float32:
        raise ValueError(
            f"x must be float32, got {x.dtype}; convert it with .float() "
            f"(exact for bfloat16 and float16)"
        )
    if q_out is None:
        q_out = torch.empty(x.shape, dtype=torch.int8, device=x.device)
    if scales_out is None:
        scales_out = torch.empty(x.shape[:-1] + (nblocks,), dtype=torch.float32, device=x.device)
    if _use_fused(x, fused):
        cuda_kernels.quantize(x, block_size, q_out, scales_out)
        return q_out, scales_out
    x3 = x.reshape(rows, nblocks, block_size)
    q3 = q_out.view(rows, nblocks, block_size)
    s2 = scales_out.view(rows, nblocks)
    # Every block's scale at once: max(amax, -amin) is max|x| (NaN included) without an
    # |x| temporary, and the per-block arithmetic runs as a few whole-tensor ops rather
    # than a few per slice.
    absmax = torch.maximum(x3.amax(dim=-1), x3.amin(dim=-1).neg_())
    inv = _scales_and_inverses(absmax, s2)
    slices = _slices(x, rows, nblocks, block_size)
    if len(slices) == 1:
        q3.copy_((x3 * inv.unsqueeze(-1)).round_())
        return q_out, scales_out
    work = torch.empty(min(nblocks, _slice_blocks(block_size)) * block_size, dtype=torch.float32)
    for part in slices:
        blocks = x3[part]
        tmp = work[: blocks.numel()].view(blocks.shape)
        # |x * inv| <= 127 up to one rounding, which round() absorbs, so no clamp is
        # needed; NaN (inf * 0 in a non-finite block) converts to some int8, dequantized
        # by a non-finite scale anyway.
        torch.mul(blocks, inv[part].unsqueeze(-1), out=tmp)
        q3[part].copy_(tmp.round_())
    return q_out, scales_out


def _scales_and_inverses(absmax: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Write ``max|x| / 127`` per block into ``scales``; return ``127 / max|x|`` per block.

    Blocks below ``FLUSH_BELOW`` get 0 for both.
    """
    # Tensor-by-tensor division is correctly rounded on every device; dividing by a
    # Python number may become a multiplication by its reciprocal on some devices, and
    # the fused kernel must produce the same bits.
    small = absmax < FLUSH_BELOW
    qmax = torch.full_like(absmax, float(QMAX))
    scales.copy_(torch.where(small, 0.0, torch.div(absmax, qmax)))
    return torch.where(small, 0.0, torch.div(qmax, absmax))


def dequantize_blocks(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    *,
    out: torch.Tensor | None = None,
    accumulate: bool = False,
    fused: bool | None = None,
) -> torch.Tensor:
    """Return ``q * scale`` per block as float32; with ``accumulate``, add it to ``out``.

    The product is rounded before the addition (no fused multiply-add), on every path,
    so the CuPy kernel and torch ops give the same bits. ``out`` must be contiguous.
    """
    rows, nblocks = _check_blocks(q, block_size, "q")
    out = _check_dequantize_args(q, scales, block_size, nblocks, out, accumulate)
    if _use_fused(q, fused):
        cuda_kernels.dequantize(q, scales, block_size, out, accumulate)
        return out
    dequantize_rows(q, scales, block_size, out, accumulate)
    return out


def dequantize_rows(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    out: torch.Tensor,
    accumulate: bool = False,
) -> None:
    """:func:`dequantize_blocks` with torch ops into ``out`` of ``q``'s shape, float32, whose
    last dimension is contiguous (rows may be strided: a column range of a larger tensor)."""
    rows, nblocks = _check_blocks(q, block_size, "q")
    q3 = q.reshape(rows, nblocks, block_size)
    s2 = scales.reshape(rows, nblocks)
    o3 = (
        out.view(rows, nblocks, block_size)
        if out.is_contiguous()
        else (torch.unflatten(out, -1, (nblocks, block_size)).reshape(rows, nblocks, block_size))
    )
    slices = _slices(q, rows, nblocks, block_size)
    work = (
        torch.empty(
            min(nblocks, _slice_blocks(block_size)) * block_size,
            dtype=torch.float32,
            device=q.device,
        )
        if accumulate
        else None
    )
    for part in slices:
        _dequantize_slice(q3[part], s2[part], o3[part], accumulate, work)


def sum_dequantized_rows(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    out: torch.Tensor,
    fused: bool | None = None,
) -> torch.Tensor:
    """``out = sum over r of q[r] * scales[r]`` in float32, adding rows in order 0, 1, ...

    ``q`` is ``(rows, cols)``; the result has the bits of dequantizing row 0 and then
    accumulating each next row, whatever the path.
    """
    rows, nblocks = _check_blocks(q, block_size, "q")
    if q.dim() != 2:
        raise ValueError(f"q must be 2-D (rows, cols), got shape {tuple(q.shape)}")
    if out.shape != q.shape[1:] or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous float32 tensor of shape "
            f"{tuple(q.shape[1:])}, got {out.dtype} {tuple(out.shape)}"
        )
    if q.device.type != "cpu":
        for r in range(rows):
            dequantize_blocks(q[r], scales[r], block_size, out=out, accumulate=r > 0, fused=fused)
        return out
    q3 = q.view(rows, nblocks, block_size)
    o2 = out.view(nblocks, block_size)
    work = torch.empty(min(nblocks, _slice_blocks(block_size)) * block_size, dtype=torch.float32)
    # Slices outermost: the partial sum of a slice stays in cache across the rows.
    for _, part in _slices(q, 1, nblocks, block_size):
        for r in range(rows):
            _dequantize_slice(q3[r, part], scales[r, part], o2[part], r > 0, work)
    return out


def _dequantize_slice(
    q: torch.Tensor,
    scales: torch.Tensor,
    out: torch.Tensor,
    accumulate: bool,
    work: torch.Tensor | None,
) -> None:
    # Convert into float32 memory first (exact), then multiply in place: faster than a
    # mixed int8-by-float32 multiply, and the product is rounded before any addition.
    if not accumulate:
        out.copy_(q)
        out.mul_(scales.unsqueeze(-1))
        return
    assert work is not None
    values = work[: q.numel()].view(q.shape)
    values.copy_(q)
    values.mul_(scales.unsqueeze(-1))
    out.add_(values)


def _slices(
    t: torch.Tensor, rows: int, nblocks: int, block_size: int
) -> list[tuple[int | slice, slice]]:
    """``(rows, blocks)`` indices of the pieces to work on, in order.

    On CPU: cache-sized runs of blocks within one row. Elsewhere: everything at once,
    since each torch op is a kernel launch.
    """
    if t.device.type != "cpu":
        return [(slice(None), slice(None))]
    step = _slice_blocks(block_size)
    return [
        (r, slice(a, min(a + step, nblocks))) for r in range(rows) for a in range(0, nblocks, step)
    ]


def _slice_blocks(block_size: int) -> int:
    return max(1, CPU_SLICE // block_size)


def _check_blocks(t: torch.Tensor, block_size: int, name: str) -> tuple[int, int]:
    """``(rows, blocks per row)`` of ``t`` seen as rows of blocks along its last dimension."""
    if t.dim() == 0 or t.shape[-1] % block_size:
        raise ValueError(
            f"{name} has shape {tuple(t.shape)}; its last dimension must be a "
            f"multiple of block_size={block_size} (pad it first)"
        )
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        raise ValueError(f"{name} must be contiguous along its last dimension")
    cols = t.shape[-1]
    return (t.numel() // cols if cols else 0), cols // block_size


def _check_dequantize_args(
    q: torch.Tensor,
    scales: torch.Tensor,
    block_size: int,
    nblocks: int,
    out: torch.Tensor | None,
    accumulate: bool,
) -> torch.Tensor:
    expected = q.shape[:-1] + (nblocks,)
    if tuple(scales.shape) != tuple(expected):
        raise ValueError(
            f"scales has shape {tuple(scales.shape)} but q of shape "
            f"{tuple(q.shape)} in blocks of {block_size} needs {tuple(expected)}"
        )
    if out is None:
        if accumulate:
            raise ValueError("accumulate=True needs out=")
        return torch.empty(q.shape, dtype=torch.float32, device=q.device)
    if out.shape != q.shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"out must be a contiguous float32 tensor of shape {tuple(q.shape)}, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    return out


def _use_fused(t: torch.Tensor, fused: bool | None) -> bool:
    if fused is False or t.device.type != "cuda":
        if fused:
            raise ValueError(f"fused=True needs a CUDA tensor, got one on {t.device}")
        return False
    if cuda_kernels.available():
        return True
    if fused:
        raise RuntimeError(
            f"fused=True but the CuPy kernels cannot be used: "
            f"{cuda_kernels.unavailable_reason()}; install "
            f"torchcomms-quantized[cuda]"
        )
    return False


# -- wire layout ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    """``rows`` chunks of ``cols`` elements, each packed as one int8 row for the wire.

    A row holds the chunk's float32 scales (as bytes) followed by its int8 payload and
    up to three bytes of padding, so every row starts 4-byte aligned and the scales of
    all rows can be viewed as float32 without copying. One message per phase carries
    both, instead of a second collective for the scales.
    """

    rows: int
    cols: int
    block_size: int

    @property
    def blocks_per_row(self) -> int:
        return self.cols // self.block_size

    @property
    def width(self) -> int:
        """Bytes per row on the wire."""
        used = 4 * self.blocks_per_row + self.cols
        return used + (-used) % 4

    def empty(self, device: torch.device) -> torch.Tensor:
        return torch.empty((self.rows, self.width), dtype=torch.int8, device=device)

    def scales(self, packed: torch.Tensor) -> torch.Tensor:
        """The float32 scales of every row, ``(rows, blocks_per_row)``, a view of ``packed``."""
        return packed[:, : 4 * self.blocks_per_row].view(torch.float32)

    def payload(self, packed: torch.Tensor) -> torch.Tensor:
        """The int8 payload of every row, ``(rows, cols)``, a view of ``packed``."""
        start = 4 * self.blocks_per_row
        return packed[:, start : start + self.cols]

    def quantize_into(self, x: torch.Tensor, packed: torch.Tensor) -> None:
        """Quantize float32 ``x`` of shape ``(rows, cols)`` into ``packed``."""
        quantize_blocks(
            x, self.block_size, q_out=self.payload(packed), scales_out=self.scales(packed)
        )

    def dequantize_row(
        self, packed: torch.Tensor, row: int, out: torch.Tensor, accumulate: bool
    ) -> None:
        """Write (or add) row ``row`` of ``packed``, dequantized, into float32 ``out``."""
        dequantize_blocks(
            self.payload(packed)[row],
            self.scales(packed)[row],
            self.block_size,
            out=out,
            accumulate=accumulate,
        )

    def dequantize_into(self, packed: torch.Tensor, out: torch.Tensor) -> None:
        """Dequantize every row of ``packed`` into float32 ``out`` of shape ``(rows, cols)``,
        whose rows may be strided (a column range of a larger tensor)."""
        payload, scales = self.payload(packed), self.scales(packed)
        if _use_fused(payload, None):
            staged = torch.empty(out.shape, dtype=torch.float32, device=out.device)
            dequantize_blocks(payload, scales, self.block_size, out=staged)
            out.copy_(staged)
            return
        dequantize_rows(payload, scales, self.block_size, out)

    def dequantize_all(self, packed: torch.Tensor, out: torch.Tensor) -> None:
        """Dequantize every row of ``packed`` into float32 ``out`` of shape ``(rows, cols)``."""
        dequantize_blocks(self.payload(packed), self.scales(packed), self.block_size, out=out)

    def sum_rows(self, packed: torch.Tensor, out: torch.Tensor) -> None:
        """``out`` (float32, ``cols``) = the dequantized rows added in row order."""
        sum_dequantized_rows(self.payload(packed), self.scales(packed), self.block_size, out)


def padded_cols(numel: int, parts: int, block_size: int) -> int:
    """Elements per part when ``numel`` is split into ``parts`` whole blocks each."""
    per_part = -(-numel // parts)
    return -(-per_part // block_size) * block_size
