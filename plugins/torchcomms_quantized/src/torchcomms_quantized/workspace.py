"""Byte buffers the quantized collectives reuse from call to call, per communicator.

A large fresh tensor costs a page fault per page on first touch, which on CPU can cost more
than quantizing it. A buffer is lent to one collective and returned when it completes, so
collectives in flight together never share one; the buffers go with the communicator.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

#: Buffers kept per communicator and device (one per collective commonly in flight).
KEEP = 2

_pools: weakref.WeakKeyDictionary[Any, dict[torch.device, list[torch.Tensor]]] = (
    weakref.WeakKeyDictionary()
)


def take(owner: Any, nbytes: int, device: torch.device) -> torch.Tensor:
    """A uint8 buffer of at least ``nbytes`` on ``device``, lent from ``owner``'s pool."""
    free = _pools.setdefault(owner, {}).setdefault(device, [])
    for i, buf in enumerate(free):
        if buf.numel() >= nbytes:
            return free.pop(i)
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device=device)


def give(owner: Any, buf: torch.Tensor) -> None:
    """Return a buffer from :func:`take`; the largest few are kept."""
    free = _pools.setdefault(owner, {}).setdefault(buf.device, [])
    free.append(buf)
    free.sort(key=torch.Tensor.numel, reverse=True)
    del free[KEEP:]


class Arena:
    """Carves aligned tensors out of one lent buffer, front to back."""

    __slots__ = ("buf", "_used")

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf = buf
        self._used = 0

    @staticmethod
    def size(*parts: tuple[int, torch.dtype]) -> int:
        """Bytes :meth:`tensor` needs for ``(numel, dtype)`` parts, alignment included."""
        total = 0
        for numel, dtype in parts:
            total += _aligned(numel * _itemsize(dtype))
        return total

    def tensor(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * _itemsize(dtype)
        start = self._used
        self._used += _aligned(nbytes)
        if self._used > self.buf.numel():
            raise RuntimeError(f"arena of {self.buf.numel()} bytes cannot hold {self._used}")
        return self.buf[start : start + nbytes].view(dtype)


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 64) * 64


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
