"""Optional cross-rank check that every rank issues matching calls (debug mode).

With ``TORCHCOMM_CHECK_COLLECTIVES=1`` each collective first compares a digest of a short
description of the call across ranks (one all_reduce of two integers), and each send,
receive and batch first exchanges a header with its peer (element count and dtype) and
waits for the peer's verdict, so a mismatch
raises a :class:`CommInputError` on both sides instead of corrupting data, hanging, or
crashing the engine. It costs one two-element all-reduce per collective, whatever the
size (the descriptions are gathered only to explain a mismatch), and two small messages
per point-to-point operation.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from typing import Any

import torch

from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.operations.table import names

_WIDTH = 160
#: Collectives whose main tensor must have the same element count on every rank.
_UNIFORM = frozenset(names(uniform=True))
#: Point-to-point operations: checked pairwise instead of by an all-gather.
P2P = frozenset(names(p2p=True))


def describe(name: str, values: tuple[Any, ...]) -> str:
    """A description of a call that every rank must agree on."""
    parts = [name]
    first = next((v for v in values if isinstance(v, torch.Tensor)), None)
    if first is None:
        lists = [v for v in values if isinstance(v, list) and v and isinstance(v[0], torch.Tensor)]
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


def verify_same_call(
    backend: Any, name: str, values: tuple[Any, ...], size: int, timeout: Any
) -> None:
    """Raise on every rank if any rank's call differs from the others'.

    One all_reduce of two integers, whatever the size: the largest and (negated) the
    smallest digest of the call's description. They are equal only when every rank made
    the same call; only then does the check end, and otherwise the descriptions are
    gathered to say which rank called what.
    """
    text = describe(name, values)
    device = getattr(backend, "device", torch.device("cpu"))
    digest = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
    digest >>= 2  # below 2**62: both it and its negation fit an int64
    bounds = torch.tensor([digest, -digest], dtype=torch.int64, device=device)
    work = backend.all_reduce(bounds, ReduceOp.MAX, False, timeout=timeout, hints=None)
    if work is not None:
        work.wait()
    highest, lowest = (int(v) for v in bounds.cpu().tolist())
    if highest == digest and -lowest == digest:
        return
    _explain_mismatch(backend, name, text, size, device, timeout)


def _explain_mismatch(
    backend: Any, name: str, text: str, size: int, device: torch.device, timeout: Any
) -> None:
    """All-gather every rank's description and raise, naming what each rank called."""
    raw = text.encode()[:_WIDTH]
    mine = torch.zeros(_WIDTH, dtype=torch.uint8)
    mine[: len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    gathered = torch.empty(size * _WIDTH, dtype=torch.uint8, device=device)
    work = backend.all_gather_single(gathered, mine.to(device), False, timeout=timeout, hints=None)
    if work is not None:
        work.wait()
    rows = gathered.cpu().view(size, _WIDTH)
    calls = [bytes(row.tolist()).rstrip(b"\0").decode(errors="replace") for row in rows]
    # The digests differed, so the calls did (even where the descriptions agree in their
    # first _WIDTH characters, which is all that is shown).
    listing = "; ".join(f"rank {r}: {c}" for r, c in enumerate(calls))
    raise CommInputError(
        f"{name}: ranks issued mismatched collectives ({listing}); every rank must call "
        f"the same operation with the same element count, dtype, root and op"
    )


def verify_call(backend: Any, name: str, values: tuple[Any, ...], size: int, timeout: Any) -> None:
    """Check that the peers of this call issued a matching one; raise on mismatch."""
    if name in P2P:
        if name == "batch_op_issue":
            ops = [tuple(op) for op in values[0]]  # P2POp unpacks as kind, tensor, peer
        else:
            ops = [(name, values[0], values[1])]
        verify_p2p(backend, ops, timeout)
    else:
        verify_same_call(backend, name, values, size, timeout)


def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode()) & 0x7FFFFFFF


def _dtype_name(code: int, candidates: Sequence[torch.Tensor]) -> str:
    for t in candidates:
        if _dtype_code(t.dtype) == code:
            return str(t.dtype).replace("torch.", "")
    for value in vars(torch).values():  # every dtype torch defines
        if isinstance(value, torch.dtype) and _dtype_code(value) == code:
            return str(value).replace("torch.", "")
    return f"dtype#{code}"


def verify_p2p(backend: Any, ops: Sequence[tuple[str, torch.Tensor, int]], timeout: Any) -> None:
    """Exchange (dtype, numel) with each peer and its verdict before any data moves.

    Round 1: every send ships a header to its receiver. Round 2: every receiver compares
    the header with its own buffer and returns a verdict. Both sides then raise the same
    error when they differ, and neither has sent or received any data.
    """
    device = getattr(backend, "device", torch.device("cpu"))
    me = backend.get_rank()
    # Round 1: senders ship (dtype, numel); receivers get the header into a buffer.
    outgoing = [[_dtype_code(t.dtype), t.numel()] if kind == "send" else None for kind, t, _ in ops]
    headers = _exchange(backend, ops, outgoing, 2, device, timeout)
    problems: list[str] = []
    verdicts: list[list[int] | None] = []
    for (_kind, tensor, peer), got in zip(ops, headers, strict=True):
        mine = [_dtype_code(tensor.dtype), tensor.numel()]
        if got is None:  # a send: its receiver answers in round 2
            verdicts.append(None)
            continue
        if got != mine:
            problems.append(
                f"rank {peer} sends {got[1]} elements of {_dtype_name(got[0], [tensor])} to "
                f"rank {me}, which receives {mine[1]} elements of "
                f"{_dtype_name(mine[0], [tensor])}"
            )
        verdicts.append([int(got == mine), *mine])
    # Round 2, the other way: receivers ship (ok, dtype, numel); senders read the verdict.
    answers = _exchange(
        backend,
        [("recv" if kind == "send" else "send", t, peer) for kind, t, peer in ops],
        verdicts,
        3,
        device,
        timeout,
    )
    for (_kind, tensor, peer), got in zip(ops, answers, strict=True):
        if got is not None and not got[0]:
            problems.append(
                f"rank {me} sends {tensor.numel()} elements of "
                f"{str(tensor.dtype).replace('torch.', '')} to rank {peer}, which receives "
                f"{got[2]} elements of {_dtype_name(got[1], [tensor])}"
            )
    if problems:
        raise CommInputError(
            "point-to-point mismatch, nothing was sent: "
            + "; ".join(problems)
            + ". A send and its receive must have the same element count and dtype"
        )


def _exchange(
    backend: Any,
    ops: Sequence[tuple[str, torch.Tensor, int]],
    outgoing: Sequence[list[int] | None],
    width: int,
    device: torch.device,
    timeout: Any,
) -> list[list[int] | None]:
    """Send ``outgoing[i]`` for each send of ``ops``; return what each receive got."""
    batch: list[tuple[str, torch.Tensor, int]] = []
    received: list[torch.Tensor | None] = []
    for (kind, _tensor, peer), values in zip(ops, outgoing, strict=True):
        if kind == "send":
            batch.append(("send", torch.tensor(values, dtype=torch.int64, device=device), peer))
            received.append(None)
        else:
            buf = torch.zeros(width, dtype=torch.int64, device=device)
            batch.append(("recv", buf, peer))
            received.append(buf)
    _run(backend, batch, timeout)
    return [None if buf is None else [int(v) for v in buf.cpu().tolist()] for buf in received]


def _run(backend: Any, ops: list[tuple[str, torch.Tensor, int]], timeout: Any) -> None:
    if not ops:
        return
    work = backend.batch_op_issue(ops, False, timeout=timeout, hints=None)
    if work is not None:
        work.wait()
