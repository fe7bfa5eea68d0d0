"""The hier backend's pipelined collectives: large messages cut into pieces, so that the
steps inside a host overlap the transfers between hosts.

Both run on even hosts (the same number of ranks on every host), over two levels the
backend hands in: ``local`` (the ranks of this host) and ``cross`` (this rank's rail).
When the cross-host level cannot use the tensors' device, each piece crosses through host
memory (``cross_device``).

May import: torch, the standard library and ``torchcomms_core.plugin``; never the backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import ReduceOp, TorchComm

#: Pipelined collectives cut messages into pieces of about this many bytes (at most
#: ``PIPELINE_MAX_PIECES``), so that local steps overlap the transfers between hosts.
PIECE_BYTES = 4 << 20
PIPELINE_MAX_PIECES = 8


def piece_count(flat: torch.Tensor) -> int:
    """How many pieces ``flat`` is cut into: one per ``PIECE_BYTES``, 1 to the maximum."""
    return max(1, min(PIPELINE_MAX_PIECES, flat.numel() * flat.element_size() // PIECE_BYTES))


def _crossing(t: torch.Tensor, cross_device: torch.device) -> torch.Tensor:
    """``t`` itself when on ``cross_device``, else a copy there."""
    return t if t.device == cross_device else t.to(cross_device)


def pipelined_all_reduce(
    local: TorchComm,
    cross: TorchComm,
    flat: torch.Tensor,
    op: ReduceOp,
    cross_device: torch.device,
    timeout: timedelta | None,
    *,
    align: int = 1,
    cross_all_reduce: Callable[[torch.Tensor], Any] | None = None,
) -> None:
    """Local reduce_scatter, rail all_reduce, local all_gather, piece by piece: while a
    piece crosses between hosts, the host reduces the next one and gathers the last.

    Each rank's part of a piece starts at a multiple of ``align`` elements of ``flat``.
    ``cross_all_reduce(part)`` replaces the rail's all_reduce (``op``, asynchronous): it
    starts the hop between hosts and returns a work (or ``None`` when done)."""
    lsize, count = local.get_size(), flat.numel()
    unit = lsize * align
    per = math.ceil(count / (unit * piece_count(flat))) * unit  # a multiple of lsize * align
    total = per * math.ceil(count / per)
    if total == count:
        buf = flat
    else:
        buf = torch.zeros(total, dtype=flat.dtype, device=flat.device)
        buf[:count].copy_(flat)
    inflight: list[tuple[torch.Tensor, torch.Tensor, Any, torch.Tensor]] = []

    def finish(piece: torch.Tensor, part: torch.Tensor, work: Any, crossed: torch.Tensor) -> None:
        if work is not None:
            work.wait()
        if crossed is not part:
            part.copy_(crossed)  # back from host memory
        local.all_gather_single(piece, part, timeout=timeout)

    for piece in torch.split(buf, per):
        part = torch.empty(per // lsize, dtype=flat.dtype, device=flat.device)
        local.reduce_scatter_single(part, piece, op, timeout=timeout)
        crossed = _crossing(part, cross_device)
        if cross_all_reduce is None:
            work = cross.all_reduce(crossed, op, True, timeout=timeout)
        else:
            work = cross_all_reduce(crossed)
        inflight.append((piece, part, work, crossed))
        if len(inflight) > 1:
            finish(*inflight.pop(0))
    while inflight:
        finish(*inflight.pop(0))
    if buf is not flat:
        flat.copy_(buf[:count])


def pipelined_gather(
    local: TorchComm,
    cross: TorchComm,
    flat: torch.Tensor,
    dests: list[torch.Tensor],
    order: list[int],
    nhosts: int,
    cross_device: torch.device,
    timeout: timedelta | None,
) -> None:
    """Rail all_gather, then local all_gather, piece by piece (while a piece crosses
    between hosts, the host gathers the last one). ``dests[r]`` (flat) receives rank
    ``r``'s ``flat``; ``order[i]`` is the rank of row ``i`` of a piece gathered locally."""
    size = len(dests)
    count = flat.numel()
    per = math.ceil(count / piece_count(flat))
    inflight: list[tuple[int, torch.Tensor, Any, torch.Tensor]] = []

    def finish(start: int, piece_out: torch.Tensor, work: Any, crossed: torch.Tensor) -> None:
        work.wait()
        if crossed is not piece_out:
            piece_out.copy_(crossed)  # back from host memory
        m = piece_out.numel() // nhosts
        gathered = torch.empty(size * m, dtype=flat.dtype, device=flat.device)
        local.all_gather_single(gathered, piece_out, timeout=timeout)
        for row, r in zip(gathered.view(size, m), order, strict=True):
            dests[r][start : start + m].copy_(row)

    for start in range(0, count, per):
        piece = flat[start : start + per]
        piece_out = torch.empty(nhosts * piece.numel(), dtype=flat.dtype, device=flat.device)
        crossed = (
            piece_out
            if piece_out.device == cross_device
            else torch.empty(piece_out.shape, dtype=flat.dtype, device=cross_device)
        )
        work = cross.all_gather_single(crossed, piece.to(crossed.device), True, timeout=timeout)
        inflight.append((start, piece_out, work, crossed))
        if len(inflight) > 1:
            finish(*inflight.pop(0))
    while inflight:
        finish(*inflight.pop(0))
