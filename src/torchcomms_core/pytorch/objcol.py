"""Object collectives over a ``TorchComm``: gather, broadcast, scatter, send and receive objects.

Received bytes are decoded like ``torch.load(weights_only=True)`` by default, so a peer
cannot make this rank run code; full pickle only with ``weights_only=False`` or
``TORCHCOMMS_SERIALIZATION=pickle``.
"""

from __future__ import annotations

import io
import pickle
from datetime import timedelta
from typing import Any

import torch

from .. import _env
from ..comm import TorchComm
from ..errors import CommInputError, CommTypeError, TorchCommError


class UnsafeObjectError(TorchCommError, pickle.UnpicklingError):
    """A received object needs full pickle to decode, which is off by default."""


def _weights_only(weights_only: bool | None) -> bool:
    if weights_only is not None:
        if not isinstance(weights_only, bool):
            raise CommTypeError(f"weights_only must be True, False or None, got {weights_only!r}")
        return weights_only
    return not _env.serialization_allows_pickle()


def _encode(obj: Any) -> torch.Tensor:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)


def _decode(data: torch.Tensor, weights_only: bool, peer: int, where: str) -> Any:
    raw = io.BytesIO(bytes(data.cpu().clone().untyped_storage()))
    try:
        return torch.load(raw, weights_only=weights_only, map_location="cpu")
    except pickle.UnpicklingError as exc:
        if not weights_only:
            raise
        raise UnsafeObjectError(
            f"{where}: refused the object from rank {peer}: it needs full pickle to decode, "
            f"which would let that rank run code here ({exc}). If every rank is trusted, pass "
            f"weights_only=False or set TORCHCOMMS_SERIALIZATION=pickle; to allow just your "
            f"classes, register them with torch.serialization.add_safe_globals([...])"
        ) from None


def _check_comm(comm: Any, where: str) -> TorchComm:
    if not isinstance(comm, TorchComm):
        raise CommTypeError(f"{where}: expected a TorchComm as first argument, got "
                            f"{type(comm).__name__}")
    return comm


def _check_list(value: Any, where: str, arg: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list):
        raise CommTypeError(f"{where}: {arg} must be a list, got {type(value).__name__}")
    if length is not None and len(value) != length:
        raise CommInputError(f"{where}: {arg} has {len(value)} entries but must have one per "
                             f"rank ({length})")
    return value


def _sizes_everywhere(comm: TorchComm, size: int, timeout: timedelta | None) -> list[int]:
    mine = torch.tensor([size], dtype=torch.int64, device=comm.get_device())
    everyone = torch.empty(comm.get_size(), dtype=torch.int64, device=comm.get_device())
    comm.all_gather_single(everyone, mine, timeout=timeout)
    return [int(s) for s in everyone.tolist()]


def _padded(data: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros(length, dtype=torch.uint8, device=device)
    out[:data.numel()] = data.to(device)
    return out


def all_gather_object(comm: TorchComm, object_list: list[Any], obj: Any, *,
                      timeout: timedelta | None = None,
                      weights_only: bool | None = None) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``."""
    where = "all_gather_object"
    comm = _check_comm(comm, where)
    n = comm.get_size()
    _check_list(object_list, where, "object_list", n)
    safe = _weights_only(weights_only)
    data = _encode(obj)
    sizes = _sizes_everywhere(comm, data.numel(), timeout)
    width, device = max(sizes), comm.get_device()
    gathered = torch.empty(n * width, dtype=torch.uint8, device=device)
    comm.all_gather_single(gathered, _padded(data, width, device), timeout=timeout)
    for r in range(n):
        object_list[r] = _decode(gathered[r * width:r * width + sizes[r]], safe, r, where)


def gather_object(comm: TorchComm, obj: Any, object_gather_list: list[Any] | None,
                  root: int = 0, *, timeout: timedelta | None = None,
                  weights_only: bool | None = None) -> None:
    """On ``root``, fill ``object_gather_list`` (one slot per rank); others pass ``None``."""
    where = "gather_object"
    comm = _check_comm(comm, where)
    n, me = comm.get_size(), comm.get_rank()
    if me == root:
        _check_list(object_gather_list, where, "object_gather_list", n)
    safe = _weights_only(weights_only)
    data = _encode(obj)
    sizes = _sizes_everywhere(comm, data.numel(), timeout)
    width, device = max(sizes), comm.get_device()
    out = torch.empty(n * width if me == root else 0, dtype=torch.uint8, device=device)
    comm.gather_single(out, _padded(data, width, device), root, timeout=timeout)
    if me == root:
        assert object_gather_list is not None
        for r in range(n):
            object_gather_list[r] = _decode(out[r * width:r * width + sizes[r]], safe, r, where)


def broadcast_object_list(comm: TorchComm, object_list: list[Any], root: int = 0, *,
                          timeout: timedelta | None = None,
                          weights_only: bool | None = None) -> None:
    """Replace every rank's ``object_list`` entries with ``root``'s (same length on all)."""
    where = "broadcast_object_list"
    comm = _check_comm(comm, where)
    _check_list(object_list, where, "object_list")
    safe = _weights_only(weights_only)
    device = comm.get_device()
    me = comm.get_rank()
    count = len(object_list)
    if me == root:
        payloads = [_encode(o) for o in object_list]
        sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    else:
        sizes = torch.empty(count, dtype=torch.int64, device=device)
    comm.broadcast(sizes, root, timeout=timeout)
    total = int(sizes.sum())
    if me == root:
        blob = torch.cat(payloads).to(device) if payloads else sizes.new_empty(0,
                                                                                dtype=torch.uint8)
    else:
        blob = torch.empty(total, dtype=torch.uint8, device=device)
    comm.broadcast(blob, root, timeout=timeout)
    if me == root:
        return
    offset = 0
    for i, s in enumerate(sizes.tolist()):
        object_list[i] = _decode(blob[offset:offset + s], safe, root, where)
        offset += s


def scatter_object_list(comm: TorchComm, scatter_object_output_list: list[Any],
                        scatter_object_input_list: list[Any] | None, root: int = 0, *,
                        timeout: timedelta | None = None,
                        weights_only: bool | None = None) -> None:
    """Put ``root``'s ``scatter_object_input_list[r]`` into rank r's output list slot 0."""
    where = "scatter_object_list"
    comm = _check_comm(comm, where)
    n, me = comm.get_size(), comm.get_rank()
    _check_list(scatter_object_output_list, where, "scatter_object_output_list")
    if not scatter_object_output_list:
        raise CommInputError(f"{where}: scatter_object_output_list needs at least one slot")
    safe = _weights_only(weights_only)
    device = comm.get_device()
    if me == root:
        inputs = _check_list(scatter_object_input_list, where, "scatter_object_input_list", n)
        payloads = [_encode(o) for o in inputs]
        sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    else:
        sizes = torch.empty(n, dtype=torch.int64, device=device)
    comm.broadcast(sizes, root, timeout=timeout)
    width = int(sizes.max())
    chunks = [_padded(p, width, device) for p in payloads] if me == root else []
    out = torch.empty(width, dtype=torch.uint8, device=device)
    comm.scatter(out, chunks, root, timeout=timeout)
    scatter_object_output_list[0] = _decode(out[:int(sizes[me])], safe, root, where)


def send_object_list(comm: TorchComm, object_list: list[Any], dst: int, *,
                     timeout: timedelta | None = None) -> None:
    """Send ``object_list`` to ``dst``, which calls ``recv_object_list`` with as many slots."""
    where = "send_object_list"
    comm = _check_comm(comm, where)
    if not _check_list(object_list, where, "object_list"):
        return
    device = comm.get_device()
    payloads = [_encode(o) for o in object_list]
    sizes = torch.tensor([p.numel() for p in payloads], dtype=torch.int64, device=device)
    comm.send(sizes, dst, timeout=timeout)
    comm.send(torch.cat(payloads).to(device), dst, timeout=timeout)


def recv_object_list(comm: TorchComm, object_list: list[Any], src: int, *,
                     timeout: timedelta | None = None,
                     weights_only: bool | None = None) -> None:
    """Fill ``object_list`` with the objects ``src`` sent with ``send_object_list``."""
    where = "recv_object_list"
    comm = _check_comm(comm, where)
    if not _check_list(object_list, where, "object_list"):
        return
    safe = _weights_only(weights_only)
    device = comm.get_device()
    sizes = torch.empty(len(object_list), dtype=torch.int64, device=device)
    comm.recv(sizes, src, timeout=timeout)
    blob = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=device)
    comm.recv(blob, src, timeout=timeout)
    offset = 0
    for i, s in enumerate(sizes.tolist()):
        object_list[i] = _decode(blob[offset:offset + s], safe, src, where)
        offset += s


__all__ = [
    "UnsafeObjectError",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]
