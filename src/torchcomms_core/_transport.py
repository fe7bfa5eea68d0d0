"""The reference's RDMA transport names, answering honestly that no RDMA is available.

The reference binds ``RdmaTransport`` and friends over ibverbs for GPU memory. This build
has no RDMA engine: ``RdmaTransport.supported()`` is ``False`` and constructing one raises
an error that names what to use instead (a communicator's ``send``/``recv`` or windows).
"""

from __future__ import annotations

from typing import Any

from ._errors import CommStateError

_WHAT_INSTEAD = (
    "this torchcomms build has no RDMA transport (the reference's needs ibverbs and GPU "
    "memory registration); move data with a communicator's send/recv or a window's put()"
)


class RdmaTransport:
    """Point-to-point RDMA endpoint; unavailable in this build (``supported()`` is False)."""

    def __init__(self, device: Any) -> None:
        raise CommStateError(f"RdmaTransport: {_WHAT_INSTEAD}")

    @staticmethod
    def supported() -> bool:
        return False


class RdmaMemory:
    """Registered memory for RDMA; unavailable in this build."""

    def __init__(self, tensor: Any) -> None:
        raise CommStateError(f"RdmaMemory: {_WHAT_INSTEAD}")


class RdmaRemoteBuffer:
    """A remote buffer description ``(ptr, len, access_key)``; picklable."""

    def __init__(self, ptr: int, len: int, access_key: str) -> None:  # noqa: A002
        self.ptr, self.len, self.access_key = ptr, len, access_key

    def __reduce__(self) -> tuple[Any, ...]:
        return (RdmaRemoteBuffer, (self.ptr, self.len, self.access_key))


def attach_rdma_memory_hook(reg: Any, dereg: Any) -> None:
    """Install the caching-allocator registration hook; unavailable in this build."""
    raise CommStateError(f"attach_rdma_memory_hook: {_WHAT_INSTEAD}")


__all__ = ["RdmaMemory", "RdmaRemoteBuffer", "RdmaTransport", "attach_rdma_memory_hook"]
