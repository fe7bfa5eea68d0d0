"""Process groups after ``TorchComm.reconfigure``: drop the stale view, register a new one.

A ``_BackendWrapper`` captures its communicator's rank, size and engine when it is built,
so a group made before a reconfigure no longer describes the communicator. After
``comm.reconfigure(...)`` call :func:`rebuild_process_group` and wrap the model again
(``DistributedDataParallel(model, process_group=pg)``, ``fully_shard(..., mesh=...)``).
"""

from __future__ import annotations

from torchcomms_core.c10d.backend_wrapper import BackendWrapper
from torchcomms_core.c10d.groups import find_group, gather_global_ranks, new_wrapper, register
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation.errors import CommStateError, CommTypeError


def _keep_comm() -> None:
    """Stands in for the old wrapper's shutdown/abort: the communicator lives on."""


def rebuild_process_group(comm: TorchComm, *, group_desc: str = "default_pg") -> BackendWrapper:
    """Replace the process group over ``comm`` with one over its current membership.

    If the old group was ``torch.distributed``'s default group, every registered group is
    destroyed with it (as ``destroy_process_group()`` does; communicators of other groups
    are finalized) and the new one becomes the default, ranks ``0..size-1``. Otherwise
    only the old group is dropped and the new one is registered beside the default.
    ``comm`` itself is never finalized by this.
    """
    import torch.distributed as dist

    if not isinstance(comm, TorchComm):
        raise CommTypeError(
            f"rebuild_process_group: expected a torchcomms TorchComm, got {type(comm).__name__}"
        )
    if comm.get_size() < 1 or comm.is_finalized():
        raise CommStateError(
            f"rebuild_process_group: communicator {comm.get_name()!r} is not "
            f"bound to a group; call comm.reconfigure(...) first"
        )
    old = find_group(comm)
    if old is not None:
        old.shutdown = _keep_comm
        old.abort = _keep_comm
        if old is dist.group.WORLD:
            dist.destroy_process_group()
        else:
            dist.destroy_process_group(old)
    default = not dist.is_initialized()
    members = list(range(comm.get_size())) if default else gather_global_ranks(comm)
    pg = new_wrapper(comm, group_desc if default else "undefined")
    register(pg, members, default=default)
    return pg


__all__ = ["rebuild_process_group"]
