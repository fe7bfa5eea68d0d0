"""Object collectives over a ``TorchComm``, safe to deserialise by default.

Re-exports only; the code lives in ``torchcomms_core.pytorch.objcol``.
"""

from torchcomms_core.pytorch.objcol import (
    UnsafeObjectError,
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)

__all__ = [
    "UnsafeObjectError",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]
