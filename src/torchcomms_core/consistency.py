"""Optional cross-rank check that every rank issues the same collective (debug mode).

With ``TORCHCOMM_CHECK_COLLECTIVES=1`` each collective first all-gathers a short
description of the call, so a mismatch raises on every rank instead of corrupting
data, hanging, or crashing the engine. It costs one extra small all-gather per call.
"""

from __future__ import annotations

from typing import Any

import torch

from .errors import CommInputError

_WIDTH = 160
#: Collectives whose main tensor must have the same element count on every rank.
_UNIFORM = frozenset({
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_single", "reduce_scatter",
    "reduce_scatter_single", "all_to_all_single",
})
#: Operations without a cross-rank shape contract (point to point) are not checked.
UNCHECKED = frozenset({"send", "recv", "batch_op_issue"})


def describe(name: str, values: tuple[Any, ...]) -> str:
    """A description of a call that every rank must agree on."""
    parts = [name]
    first = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if first is None:
        lists = [v for v in values if isinstance(v, list) and v and
                 isinstance(v[0], torch.Tensor)]
        first = lists[0][0] if lists else None
    if first is not None:
        parts.append(str(first.dtype).replace("torch.", ""))
        if name in _UNIFORM:
            parts.append(f"numel={first.numel()}")
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool):
            parts.append(f"root={v}")
        elif type(v).__name__ == "ReduceOp":
            parts.append(repr(v.type))
    return " ".join(parts)


def verify_same_call(backend: Any, name: str, values: tuple[Any, ...], size: int,
                     timeout: Any) -> None:
    """All-gather the call's description and raise on every rank if any rank differs."""
    text = describe(name, values).encode()[:_WIDTH]
    mine = torch.zeros(_WIDTH, dtype=torch.uint8)
    mine[: len(text)] = torch.tensor(list(text), dtype=torch.uint8)
    device = getattr(backend, "device", torch.device("cpu"))
    gathered = torch.empty(size * _WIDTH, dtype=torch.uint8, device=device)
    work = backend.all_gather_single(gathered, mine.to(device), False, timeout=timeout,
                                     hints=None)
    if work is not None:
        work.wait()
    rows = gathered.cpu().view(size, _WIDTH)
    calls = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in rows]
    if len(set(calls)) > 1:
        listing = "; ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
        raise CommInputError(
            f"{name}: ranks issued mismatched collectives ({listing}); every rank must call "
            f"the same operation with the same element count, dtype, root and op"
        )
