"""The benchmarks of the quantized collectives, for ``torchcomms bench``.

``plugin.py`` declares them through ``Collective(bench=...)``; this module is imported
only when a benchmark runs. Results are checked against the error bound the README
documents, not for equality.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import bench


class _Quantized(bench.PluginOp):
    """Counts elements outside the error bound torchcomms-quantized documents (its README).

    The plugin's data moves as int8 with one float32 scale per block, so results are
    approximate by design. Per element of block ``b``: ``|result - exact| <= A_b / divisor``
    for SUM (divided by ``n`` for AVG), ``A_b`` being the sum over ranks of max|x| over the
    block, plus ``flushes * 2**-100`` for blocks flushed to zero, plus the final rounding to
    bfloat16/float16: ``u * (|exact| + that)`` and, for float16 subnormals, ``2**-25``.
    Restated from the README rather than imported from ``bounds``, so the bench checks the
    documented contract independently of the code that implements it.
    """

    #: The collective's default block size, which ``run`` uses.
    block_size: ClassVar[int] = 256
    #: The ``divisor`` of the bound.
    divisor: ClassVar[int]
    #: The bound's ``flushes``: ``nranks`` plus this many.
    extra_flushes: ClassVar[int] = 0
    _FLUSH: ClassVar[float] = 2.0**-100
    _ROUNDING: ClassVar[dict[torch.dtype, tuple[float, float]]] = {
        torch.float32: (0.0, 0.0),
        torch.bfloat16: (2.0**-8, 0.0),
        torch.float16: (2.0**-11, 2.0**-25),
    }

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if dtype not in self._ROUNDING:
            return (
                f"needs a floating-point datatype (float32, bfloat16, float16), got "
                f"{bench.dtype_name(dtype)}"
            )
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return super().refuses(dtype, redop, nranks)

    def count_wrong(self, bufs: bench.Buffers, case: bench.Case) -> int:
        """Elements farther from the exact result than the documented error bound."""
        flat = bufs.output.view(-1)
        n, size = case.nranks, self.block_size
        unit, tiny = self._ROUNDING[case.dtype]
        ranks = [dataclasses.replace(case, rank=r) for r in range(n)]
        # Where this rank's output lies in every rank's input. Each output is padded to
        # whole blocks, so blocks start at the output's start.
        parts = self.input_parts(bufs.count, case)
        start_in_input = 0 if parts is None else bench.starts(parts)[case.rank]
        wrong = 0
        # BLOCK (2**20) is a multiple of the block size, so quantization blocks never straddle
        # two of these slices.
        for start, stop, index in bench.blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            absmax_sum = torch.zeros(
                -(-(stop - start) // size), dtype=torch.float64, device=flat.device
            )
            for rank_case in ranks:
                addends = self.input_values(index + start_in_input, bufs.count, rank_case)
                addends = addends.to(torch.float64)
                exact += addends
                padded = torch.zeros(
                    absmax_sum.numel() * size, dtype=torch.float64, device=flat.device
                )
                padded[: addends.numel()] = addends.abs()
                absmax_sum += padded.view(-1, size).amax(dim=1)
            per_block = absmax_sum / self.divisor
            if case.redop == "avg":
                exact /= n
                per_block /= n
            per_block += (n + self.extra_flushes) * self._FLUSH
            quantized = per_block.repeat_interleave(size)[: stop - start]
            bound = quantized + unit * (exact.abs() + quantized) + tiny
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            # A NaN result is wrong too: compare with "not within" rather than "above".
            wrong += int((~(error <= bound)).sum())
        return wrong


class QuantizedAllReduce(_Quantized, bench.AllReduce):
    """In place, like all_reduce, through the ``quantized_all_reduce`` plugin collective."""

    name = "quantized_all_reduce"
    divisor = 126
    extra_flushes = 1

    def run(self, comm: Any, bufs: bench.Buffers, case: bench.Case) -> None:
        comm.quantized_all_reduce(bufs.output, case.reduce_op)


class QuantizedReduceScatter(_Quantized, bench.ReduceScatterSingle):
    """Like reduce_scatter_single, through the ``quantized_reduce_scatter`` plugin collective.

    One int8 quantization.
    """

    name = "quantized_reduce_scatter"
    forms = (bench.OUT_OF_PLACE,)
    divisor = 250

    def run(self, comm: Any, bufs: bench.Buffers, case: bench.Case) -> None:
        comm.quantized_reduce_scatter(bufs.output, bufs.input, case.reduce_op)


class ReduceScatterQuantized(bench.PluginOp, bench.ReduceScatterSingle):
    """Like reduce_scatter_single, through ``reduce_scatter_quantized`` (the reference's:
    float32 in and out, bfloat16 with stochastic rounding on the wire).

    Checked against its documented bound, restated here rather than imported: per element,
    ``|result - exact| <= sum_r |x_r| * (2**-7 + n * 2**-23)`` (divided by ``n`` for AVG).
    """

    name = "reduce_scatter_quantized"
    forms = (bench.OUT_OF_PLACE,)

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        if dtype != torch.float32:
            return f"takes float32 tensors only (as the reference), got {bench.dtype_name(dtype)}"
        if redop not in ("sum", "avg"):
            return f"reduces with sum or avg only, got --op {redop}"
        return super().refuses(dtype, redop, nranks)

    def run(self, comm: Any, bufs: bench.Buffers, case: bench.Case) -> None:
        seed = torch.tensor([case.rank], dtype=torch.int64, device=bufs.output.device)
        comm.reduce_scatter_quantized(bufs.output, bufs.input, case.reduce_op, seed)

    def count_wrong(self, bufs: bench.Buffers, case: bench.Case) -> int:
        """Elements farther from the exact result than the documented bound."""
        flat = bufs.output.view(-1)
        n = case.nranks
        parts = self.input_parts(bufs.count, case)
        start_in_input = 0 if parts is None else bench.starts(parts)[case.rank]
        wrong = 0
        for start, stop, index in bench.blocks(flat.numel(), flat.device):
            exact = torch.zeros(stop - start, dtype=torch.float64, device=flat.device)
            magnitude = torch.zeros_like(exact)
            for r in range(n):
                rank_case = dataclasses.replace(case, rank=r)
                addends = self.input_values(index + start_in_input, bufs.count, rank_case)
                exact += addends.to(torch.float64)
                magnitude += addends.to(torch.float64).abs()
            bound = magnitude * (2.0**-7 + n * 2.0**-23)
            if case.redop == "avg":
                exact /= n
                bound /= n
            error = (flat[start:stop].to(torch.float64) - exact).abs()
            wrong += int((~(error <= bound)).sum())
        return wrong
