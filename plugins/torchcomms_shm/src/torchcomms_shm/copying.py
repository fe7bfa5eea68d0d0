"""The byte copies every part of the shm backend makes between tensors and the segment.

``TORCHCOMM_SHM_COPY`` picks how: ``memmove`` (the default: one thread, glibc's memcpy)
or ``torch`` (``Tensor.copy_``, which splits large copies over torch's intra-op threads).

May import: torch and the standard library.
"""

from __future__ import annotations

import ctypes
import os

import torch

#: ``memmove`` (one thread, glibc's memcpy) or ``torch`` (``Tensor.copy_``, which splits
#: large copies over torch's intra-op threads).
_COPY_WITH = os.environ.get("TORCHCOMM_SHM_COPY", "memmove")


def copy_to(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst``: contiguous, same dtype and size (one ``memmove``)."""
    if _COPY_WITH == "torch":
        dst.copy_(src)
        return
    nbytes = src.nbytes
    if nbytes:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


def as_u8(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)
