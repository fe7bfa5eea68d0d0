"""Object collectives over a ``TorchComm``: gather, broadcast, scatter, send and receive objects.

The six functions take the reference's arguments in the reference's order, e.g.
``gather_object(comm, obj, root, object_gather_list=None, timeout=None, weights_only=True)``.
Received bytes are decoded like ``torch.load(weights_only=True)`` by default, so a peer
cannot make this rank run code; full pickle only with ``weights_only=False``, or with
``TORCHCOMMS_SERIALIZATION=pickle``, which (as in the reference) serializes with plain
``pickle`` and decodes with it whatever ``weights_only`` says.

Every call first agrees on a small header (item count, whether the rank accepted its own
arguments, payload size, size limit), so a mismatch between ranks or an oversized payload
is refused with the same :class:`CommInputError` on every rank before any payload moves,
and nothing is allocated from a size a peer declared beyond ``TORCHCOMM_OBJCOL_MAX_BYTES``.
The rooted ones (gather, broadcast, scatter) agree through one all_reduce of a few
integers, a cost per rank that does not grow with the world; every rank's header is
gathered only when that shows a problem, to name the ranks.
"""

from __future__ import annotations

import functools
import inspect
import io
import pickle
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, TypeVar

import torch

from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import (
    CommInputError,
    CommOperationError,
    CommTypeError,
    TorchCommError,
)


class UnsafeObjectError(TorchCommError, pickle.UnpicklingError):
    """A received object needs full pickle to decode, which is off by default."""


# Header fields, one int64 each, exchanged before any payload.
_COUNT, _STATUS, _NBYTES, _LIMIT = range(4)
_HEADER = 4
# ``_STATUS``: the rank accepted its arguments, or refused them and raises its own error.
_OK, _REFUSED = 0, 1
# Verdicts a receiver sends back to ``send_object_list`` before the payload moves.
_GO, _WRONG_COUNT, _TOO_LARGE, _RECEIVER_REFUSED = range(4)
_INT64 = 8


def _weights_only(weights_only: bool | None) -> bool:
    """Whether received objects are decoded safely (``None`` means the default, True)."""
    if weights_only is None:
        return True
    if not isinstance(weights_only, bool):
        raise CommTypeError(f"weights_only must be True or False, got {weights_only!r}")
    return weights_only


def _use_pickle() -> bool:
    """``TORCHCOMMS_SERIALIZATION=pickle``: plain pickle both ways, as the reference does."""
    try:
        return _env.serialization_allows_pickle()
    except ValueError as exc:
        raise CommInputError(str(exc)) from None


_F = TypeVar("_F", bound=Callable[..., Any])


def _reference_order(fn: _F) -> _F:
    """Explain a call that does not fit the reference's parameter order.

    Keeps ``fn``'s signature for ``inspect``; a call that cannot bind (for example the
    old ``gather_object(comm, obj, gather_list, root=0)``) raises a ``CommTypeError``
    that shows the order to use.
    """
    sig = inspect.signature(fn)
    plain = ", ".join(
        p.name if p.default is inspect.Parameter.empty else f"{p.name}={p.default}"
        for p in sig.parameters.values()
    )

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise CommTypeError(
                f"{fn.__name__}: {exc}. The arguments are {fn.__name__}({plain}), in the "
                f"order of Meta's torchcomms (a root comes before the object lists)"
            ) from None
        return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


def _check_root(root: Any, n: int, where: str) -> int:
    if isinstance(root, bool) or not isinstance(root, int):
        raise CommTypeError(
            f"{where}: root must be a rank (int), got {type(root).__name__}. The order is "
            f"{where}(comm, ..., root, ...) as in Meta's torchcomms: pass the rank before "
            f"the object lists"
        )
    if not 0 <= root < n:
        raise CommInputError(
            f"{where}: root {root} is not a rank of this communicator (0..{n - 1})"
        )
    return root


def _limit() -> int:
    try:
        return _env.objcol_max_bytes()
    except ValueError as exc:
        raise CommInputError(str(exc)) from None


def _encode(obj: Any, plain_pickle: bool = False) -> torch.Tensor:
    buf = io.BytesIO()
    if plain_pickle:
        pickle.dump(obj, buf)
    else:
        torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _pack(payloads: list[torch.Tensor]) -> torch.Tensor:
    """The payloads behind a prefix of their sizes (int64), as one byte tensor."""
    sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64)
    return torch.cat([sizes.view(torch.uint8), *payloads])


def _unpack(blob: torch.Tensor, count: int, peer: int, where: str) -> list[torch.Tensor]:
    """Split what :func:`_pack` made, checking the sizes a peer declared against the bytes."""
    head = count * _INT64
    short = blob.numel() < head
    sizes = [] if short or not count else blob[:head].cpu().clone().view(torch.int64).tolist()
    if short or any(s < 0 for s in sizes) or sum(sizes) != blob.numel() - head:
        raise CommOperationError(
            f"{where}: rank {peer} sent {blob.numel()} bytes whose object sizes {sizes[:8]} do "
            f"not add up; it does not speak this version's object protocol. Run the same "
            f"torchcomms version on every rank"
        )
    out, offset = [], head
    for s in sizes:
        out.append(blob[offset : offset + s])
        offset += s
    return out


# ``torch.save`` writes a zip archive; ``pickle`` (protocol 2 and later) starts with PROTO.
_ZIP_MAGIC = b"PK\x03\x04"


def _decode(data: torch.Tensor, weights_only: bool, peer: int, where: str) -> Any:
    raw = bytes(data.cpu().clone().untyped_storage())
    plain_pickle = _use_pickle()
    if not raw.startswith(_ZIP_MAGIC):
        # Plain pickle from a rank with TORCHCOMMS_SERIALIZATION=pickle.
        if not plain_pickle:
            raise UnsafeObjectError(
                f"{where}: refused the object from rank {peer}: it was serialized with plain "
                f"pickle (TORCHCOMMS_SERIALIZATION=pickle on that rank), which would let that "
                f"rank run code here. Set TORCHCOMMS_SERIALIZATION=pickle on every rank if "
                f"every rank is trusted, or unset it everywhere"
            )
        return pickle.loads(raw)
    try:
        return torch.load(
            io.BytesIO(raw), weights_only=weights_only and not plain_pickle, map_location="cpu"
        )
    except pickle.UnpicklingError as exc:
        if not weights_only or plain_pickle:
            raise
        raise UnsafeObjectError(
            f"{where}: refused the object from rank {peer}: it needs full pickle to decode, "
            f"which would let that rank run code here ({exc}). If every rank is trusted, pass "
            f"weights_only=False or set TORCHCOMMS_SERIALIZATION=pickle; to allow just your "
            f"classes, register them with torch.serialization.add_safe_globals([...])"
        ) from None


def _check_comm(comm: Any, where: str) -> TorchComm:
    if not isinstance(comm, TorchComm):
        raise CommTypeError(
            f"{where}: expected a TorchComm as first argument, got {type(comm).__name__}"
        )
    return comm


def _check_list(value: Any, where: str, arg: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise CommTypeError(f"{where}: {arg} must be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise CommInputError(
            f"{where}: {arg} has {len(value)} entries but must have one per rank ({length})"
        )
    return value


def _header(
    count: int, error: BaseException | None, nbytes: int, limit: int, device: torch.device
) -> torch.Tensor:
    return torch.tensor(
        [count, _REFUSED if error else _OK, nbytes, limit], dtype=torch.int64, device=device
    )


def _exchange(comm: TorchComm, header: torch.Tensor, timeout: timedelta | None) -> list[list[int]]:
    """Every rank's header, in rank order."""
    table = torch.zeros(comm.get_size() * _HEADER, dtype=torch.int64, device=header.device)
    comm.all_gather_single(table, header, timeout=timeout)
    return table.view(-1, _HEADER).tolist()


# A value below every limit and size, for ranks a bound does not concern.
_LOWEST = -(2**62)


def _bounds(comm: TorchComm, values: list[int], timeout: timedelta | None) -> list[int]:
    """The largest of each value over all ranks: one all_reduce of a few integers.

    Rooted object collectives agree through this instead of gathering a header from every
    rank, so their cost per rank does not grow with the world: a minimum is the negated
    maximum of negated values, and a rank a value does not concern passes ``_LOWEST``. Only
    when the bounds show a problem is every rank's header gathered, to say who and what.
    """
    from torchcomms_core.operations.reduce_op import ReduceOp

    bounds = torch.tensor(values, dtype=torch.int64, device=comm.get_device())
    comm.all_reduce(bounds, ReduceOp.MAX, timeout=timeout)
    return [int(v) for v in bounds.cpu().tolist()]


def _settle(
    table: list[list[int]], error: BaseException | None, where: str, receivers: Iterable[int]
) -> None:
    """Raise the same refusal on every rank if any rank refused or a payload is too large.

    Every rank decides from the same table, so they all raise or all go on together.
    """
    if error is not None:
        raise error
    refused = [r for r, row in enumerate(table) if row[_STATUS] != _OK]
    if refused:
        who = ", ".join(map(str, refused))
        raise CommInputError(
            f"{where}: rank(s) {who} refused their arguments, so no object was exchanged; the "
            f"error on those ranks says what to fix. This communicator is still usable"
        )
    receivers = list(receivers)
    if not receivers:
        return
    cap_rank = min(receivers, key=lambda r: table[r][_LIMIT])
    cap = table[cap_rank][_LIMIT]
    for r, row in enumerate(table):
        if not 0 <= row[_NBYTES] <= cap:
            raise CommInputError(
                f"{where}: rank {r} declared {row[_NBYTES]} bytes of serialized objects, over "
                f"the limit of {cap} bytes ({_env.OBJCOL_MAX_BYTES} on rank {cap_rank}); nothing "
                f"was allocated or exchanged. Send smaller objects, or raise "
                f"{_env.OBJCOL_MAX_BYTES} on every rank"
            )


def _chunk(out: torch.Tensor, peer: int, where: str) -> torch.Tensor:
    """The part of a padded chunk that its own size prefix (from :func:`_pack`) covers."""
    width = out.numel()
    size = int(out[:_INT64].cpu().clone().view(torch.int64)) if width >= _INT64 else -1
    if not 0 <= size <= width - _INT64:
        raise CommOperationError(
            f"{where}: rank {peer} sent a chunk that declares {size} bytes "
            f"in {width}; run the same torchcomms version on every rank"
        )
    return out[: _INT64 + size]


def _padded(data: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros(length, dtype=torch.uint8, device=device)
    out[: data.numel()] = data.to(device)
    return out


@_reference_order
def all_gather_object(
    comm: TorchComm,
    object_list: list[Any],
    obj: Any,
    timeout: timedelta | None = None,
    weights_only: bool = True,
) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``.

    Raises:
        CommInputError: on every rank, if any rank passed a wrong list or an object over
            ``TORCHCOMM_OBJCOL_MAX_BYTES``.
    """
    where = "all_gather_object"
    comm = _check_comm(comm, where)
    n, device = comm.get_size(), comm.get_device()
    error: BaseException | None = None
    data, limit = torch.zeros(0, dtype=torch.uint8), 0
    try:
        limit = _limit()
        _check_list(object_list, where, "object_list", n)
        safe = _weights_only(weights_only)
        data = _encode(obj, _use_pickle())
    except Exception as exc:  # told to every rank first, then raised here
        error = exc
    table = _exchange(comm, _header(1, error, data.numel(), limit, device), timeout)
    _settle(table, error, where, range(n))
    sizes = [row[_NBYTES] for row in table]
    width = max(sizes)
    gathered = torch.zeros(n * width, dtype=torch.uint8, device=device)
    comm.all_gather_single(gathered, _padded(data, width, device), timeout=timeout)
    for r in range(n):
        object_list[r] = _decode(gathered[r * width : r * width + sizes[r]], safe, r, where)


@_reference_order
def gather_object(
    comm: TorchComm,
    obj: Any,
    root: int,
    object_gather_list: list[Any] | None = None,
    timeout: timedelta | None = None,
    weights_only: bool = True,
) -> None:
    """On ``root``, fill ``object_gather_list`` (one slot per rank); others pass ``None``."""
    where = "gather_object"
    comm = _check_comm(comm, where)
    n, me, device = comm.get_size(), comm.get_rank(), comm.get_device()
    error: BaseException | None = None
    data, limit = torch.zeros(0, dtype=torch.uint8), 0
    try:
        limit = _limit()
        root = _check_root(root, n, where)
        if me == root:
            _check_list(object_gather_list, where, "object_gather_list", n)
        safe = _weights_only(weights_only)
        data = _encode(obj, _use_pickle())
    except Exception as exc:
        error = exc
    chunk = _pack([data])  # its own size in front: the root needs no table of sizes
    refused, width, cap = _bounds(
        comm,
        [int(error is not None), chunk.numel(), -limit if me == root else _LOWEST],
        timeout,
    )
    if refused or width - _INT64 > -cap:  # say who refused or sent too much, on every rank
        _settle(
            _exchange(comm, _header(1, error, data.numel(), limit, device), timeout),
            error,
            where,
            [root],
        )
    out = torch.zeros(n * width if me == root else 0, dtype=torch.uint8, device=device)
    comm.gather_single(out, _padded(chunk, width, device), root, timeout=timeout)
    if me == root:
        assert object_gather_list is not None
        for r in range(n):
            (one,) = _unpack(_chunk(out[r * width : (r + 1) * width], r, where), 1, r, where)
            object_gather_list[r] = _decode(one, safe, r, where)


@_reference_order
def broadcast_object_list(
    comm: TorchComm,
    object_list: list[Any],
    root: int,
    timeout: timedelta | None = None,
    weights_only: bool = True,
) -> None:
    """Replace every rank's ``object_list`` entries with ``root``'s (same length on all).

    Raises:
        CommInputError: on every rank, if the list lengths differ between ranks or root's
            objects exceed ``TORCHCOMM_OBJCOL_MAX_BYTES``.
    """
    where = "broadcast_object_list"
    comm = _check_comm(comm, where)
    me, device = comm.get_rank(), comm.get_device()
    error: BaseException | None = None
    count, blob, limit = 0, torch.zeros(0, dtype=torch.uint8), 0
    try:
        limit = _limit()
        root = _check_root(root, comm.get_size(), where)
        count = len(_check_list(object_list, where, "object_list"))
        safe = _weights_only(weights_only)
        if me == root:
            plain = _use_pickle()
            blob = _pack([_encode(o, plain) for o in object_list])
    except Exception as exc:
        error = exc
    is_root = me == root
    refused, most, fewest, nbytes, cap = _bounds(
        comm,
        [
            int(error is not None),
            count,
            -count,
            blob.numel() if is_root else _LOWEST,
            _LOWEST if is_root else -limit,
        ],
        timeout,
    )
    if refused or most != -fewest or (comm.get_size() > 1 and nbytes > -cap):
        table = _exchange(comm, _header(count, error, blob.numel(), limit, device), timeout)
        _settle(table, error, where, [r for r in range(len(table)) if r != root])
        expected = table[root][_COUNT]
        different = [(r, row[_COUNT]) for r, row in enumerate(table) if row[_COUNT] != expected]
        if different:
            others = ", ".join(f"rank {r} has {c}" for r, c in different)
            raise CommInputError(
                f"{where}: object_list must have the same length on every rank, but root rank "
                f"{root} has {expected} entries and {others}; nothing was broadcast. Pass a "
                f"list of {expected} entries on every rank (placeholders such as None on the "
                f"receivers)"
            )
    expected = most
    if nbytes == 0:
        return
    if me != root:
        blob = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    else:
        blob = blob.to(device)
    comm.broadcast(blob, root, timeout=timeout)
    if me == root:
        return
    for i, data in enumerate(_unpack(blob, expected, root, where)):
        object_list[i] = _decode(data, safe, root, where)


@_reference_order
def scatter_object_list(
    comm: TorchComm,
    root: int,
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    timeout: timedelta | None = None,
    weights_only: bool = True,
) -> None:
    """Put ``root``'s ``scatter_object_input_list[r]`` into rank r's output list slot 0.

    Raises:
        CommInputError (a ``ValueError``): on every rank, if a rank's output list is empty
            or the root gives no input list (one entry per rank).
    """
    where = "scatter_object_list"
    comm = _check_comm(comm, where)
    n, me, device = comm.get_size(), comm.get_rank(), comm.get_device()
    error: BaseException | None = None
    chunks: list[torch.Tensor] = []
    limit = 0
    try:
        limit = _limit()
        root = _check_root(root, n, where)
        _check_list(scatter_object_output_list, where, "scatter_object_output_list")
        if not scatter_object_output_list:
            raise CommInputError(f"{where}: scatter_object_output_list needs at least one slot")
        safe = _weights_only(weights_only)
        if me == root:
            inputs = _check_list(scatter_object_input_list, where, "scatter_object_input_list", n)
            plain = _use_pickle()
            chunks = [_pack([_encode(o, plain)]) for o in inputs]
    except Exception as exc:
        error = exc
    width = max((c.numel() for c in chunks), default=0)
    is_root = me == root
    refused, width, cap = _bounds(
        comm,
        [int(error is not None), width if is_root else _LOWEST, _LOWEST if is_root else -limit],
        timeout,
    )
    if refused or (n > 1 and width > -cap):
        table = _exchange(comm, _header(1, error, max(width, 0), limit, device), timeout)
        _settle(table, error, where, [r for r in range(n) if r != root])
    padded = [_padded(c, width, device) for c in chunks]
    out = torch.zeros(width, dtype=torch.uint8, device=device)
    comm.scatter(out, padded, root, timeout=timeout)
    (data,) = _unpack(_chunk(out, root, where), 1, root, where)
    scatter_object_output_list[0] = _decode(data, safe, root, where)


@_reference_order
def send_object_list(
    comm: TorchComm, object_list: list[Any], dst: int, timeout: timedelta | None = None
) -> None:
    """Send ``object_list`` to ``dst``, which calls ``recv_object_list`` with as many slots.

    The count and size go first and ``dst`` answers before any payload moves, so a
    receiver with a different number of slots, or one that refuses the size, makes both
    ranks raise :class:`CommInputError` at once.
    """
    where = "send_object_list"
    comm = _check_comm(comm, where)
    device = comm.get_device()
    error: BaseException | None = None
    count, blob = 0, torch.zeros(0, dtype=torch.uint8)
    try:
        count = len(_check_list(object_list, where, "object_list"))
        plain = _use_pickle()
        blob = _pack([_encode(o, plain) for o in object_list])
    except Exception as exc:
        error = exc
    comm.send(_header(count, error, blob.numel(), 0, device), dst, timeout=timeout)
    if error is not None:
        raise error
    verdict = torch.zeros(2, dtype=torch.int64, device=device)
    comm.recv(verdict, dst, timeout=timeout)
    code, detail = verdict.tolist()
    if code == _WRONG_COUNT:
        raise CommInputError(
            f"{where}: rank {dst} expects {detail} objects but this rank sent {count}; nothing "
            f"was sent. Call recv_object_list on rank {dst} with a list of {count} slots"
        )
    if code == _TOO_LARGE:
        raise CommInputError(
            f"{where}: rank {dst} refused {blob.numel()} bytes of serialized objects, over its "
            f"limit of {detail} bytes ({_env.OBJCOL_MAX_BYTES}); send smaller objects or raise "
            f"the limit on rank {dst}"
        )
    if code != _GO:
        raise CommInputError(
            f"{where}: rank {dst} refused its recv_object_list arguments, so nothing was sent; "
            f"the error on rank {dst} says what to fix"
        )
    if blob.numel():
        comm.send(blob.to(device), dst, timeout=timeout)


@_reference_order
def recv_object_list(
    comm: TorchComm,
    object_list: list[Any],
    src: int,
    timeout: timedelta | None = None,
    weights_only: bool = True,
) -> None:
    """Fill ``object_list`` with the objects ``src`` sent with ``send_object_list``.

    Raises:
        CommInputError: on both ranks, if ``object_list`` has a different number of slots
            than ``src`` sent, or the payload exceeds ``TORCHCOMM_OBJCOL_MAX_BYTES``.
    """
    where = "recv_object_list"
    comm = _check_comm(comm, where)
    device = comm.get_device()
    error: BaseException | None = None
    limit = 0
    try:
        _check_list(object_list, where, "object_list")
        safe = _weights_only(weights_only)
        limit = _limit()
    except Exception as exc:
        error = exc
    header = torch.zeros(_HEADER, dtype=torch.int64, device=device)
    comm.recv(header, src, timeout=timeout)
    count, status, nbytes, _ = header.tolist()
    if status != _OK:  # the sender raised right after its header and waits for nothing
        if error is not None:
            raise error
        raise CommInputError(
            f"{where}: rank {src} refused its send_object_list arguments, so "
            f"nothing was received; the error on rank {src} says what to fix"
        )
    if error is not None:
        code, detail = _RECEIVER_REFUSED, 0
    elif count != len(object_list):
        code, detail = _WRONG_COUNT, len(object_list)
    elif not 0 <= nbytes <= limit:
        code, detail = _TOO_LARGE, limit
    else:
        code, detail = _GO, 0
    comm.send(torch.tensor([code, detail], dtype=torch.int64, device=device), src, timeout=timeout)
    if error is not None:
        raise error
    if code == _WRONG_COUNT:
        raise CommInputError(
            f"{where}: rank {src} sent {count} objects but object_list has {len(object_list)} "
            f"slots; nothing was received. Pass a list of {count} slots (as many as "
            f"send_object_list sends)"
        )
    if code == _TOO_LARGE:
        raise CommInputError(
            f"{where}: rank {src} declared {nbytes} bytes of serialized objects, over the limit "
            f"of {limit} bytes ({_env.OBJCOL_MAX_BYTES}); nothing was allocated or received. "
            f"Send smaller objects, or raise {_env.OBJCOL_MAX_BYTES} on this rank"
        )
    blob = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    if nbytes:
        comm.recv(blob, src, timeout=timeout)
    for i, data in enumerate(_unpack(blob, count, src, where)):
        object_list[i] = _decode(data, safe, src, where)


__all__ = [
    "UnsafeObjectError",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]
