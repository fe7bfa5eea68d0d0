"""``torchcomms.distwrap``: a ``torch.distributed`` look-alike that runs on torchcomms.

Code written against c10d switches with one import (``import torchcomms.distwrap as
dist``). ``init_process_group(..., use_torchcomms=False)`` (the default) hands every call
to ``torch.distributed``; with ``use_torchcomms=True`` each group holds one torchcomms
communicator per device type and every call runs on them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch.distributed as _dist
from torch._C._distributed_c10d import HashStore, Store
from torch.distributed import (
    GroupMember,
    ProcessGroup,
    ProcessGroupGloo,
    ReduceOp,
    Work,
    get_process_group_ranks,
    get_rank,
    get_world_size,
    group,
    is_available,
    is_initialized,
)

from torchcomms_core.foundation.errors import CommInputError, CommStateError
from torchcomms_core.pytorch.distwrap import world as _world
from torchcomms_core.pytorch.distwrap.collectives import (
    all_gather,
    all_gather_into_tensor,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_quantized,
    reduce_scatter_tensor,
    scatter,
)
from torchcomms_core.pytorch.distwrap.memory import (
    _make_nccl_premul_sum,
    get_mem_allocator,
    new_window,
    register_mem_pool,
)
from torchcomms_core.pytorch.distwrap.objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from torchcomms_core.pytorch.distwrap.p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from torchcomms_core.pytorch.distwrap.world import TorchCommsGroup

__all__ = [
    "GroupMember",
    "HashStore",
    "P2POp",
    "ProcessGroup",
    "ProcessGroupGloo",
    "ReduceOp",
    "Store",
    "TorchCommsGroup",
    "Work",
    "_make_nccl_premul_sum",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_mem_allocator",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_process_group",
    "irecv",
    "is_available",
    "is_initialized",
    "isend",
    "new_group",
    "new_window",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_quantized",
    "reduce_scatter_tensor",
    "register_mem_pool",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "split_group",
    "uses_torchcomms",
]


def __getattr__(name: str) -> Any:
    # Only CUDA builds of torch define ProcessGroupNCCL: looked up when asked (and so not
    # in __all__, which star-imports would fail on).
    if name == "ProcessGroupNCCL":
        found = getattr(_dist, "ProcessGroupNCCL", None)
        if found is None:
            raise AttributeError(
                "ProcessGroupNCCL is not available: this PyTorch build has no NCCL "
                "(a CPU build); use ProcessGroupGloo or a CUDA build of PyTorch"
            )
        return found
    raise AttributeError(f"module 'torchcomms.distwrap' has no attribute {name!r}")


def uses_torchcomms() -> bool:
    """Whether this process was initialised with ``use_torchcomms=True``."""
    return _world.torchcomms_mode()


def init_process_group(
    backend: Any = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
    use_torchcomms: bool = False,
) -> None:
    """Initialise the default group, on ``torch.distributed`` or on torchcomms.

    Without ``use_torchcomms`` every argument goes to ``torch.distributed.init_process_group``
    (``ncclx``/``rcclx`` are named ``nccl``/``rccl`` there). With it, one communicator per
    device type of ``backend`` (``"gloo"`` -> cpu, ``"ncclx"`` -> cuda, or
    ``"cpu:gloo,cuda:nccl"``; CUDA entries are skipped where there is no GPU) over one
    shared store (``store``, ``init_method``, or ``MASTER_ADDR``/``MASTER_PORT``, default
    ``localhost:29500``), named ``group_name`` or ``default_torchcomm_<backend>``;
    ``device_id`` is not used. Rank and world size of -1 come from OpenMPI, torchrun,
    SLURM or PMI variables, in that order.
    """
    if not isinstance(use_torchcomms, bool):
        raise CommInputError(
            f"init_process_group: use_torchcomms must be a bool, got {use_torchcomms!r}"
        )
    if use_torchcomms:
        _world.init_torchcomms(
            backend, init_method, timeout, world_size, rank, store, group_name, pg_options
        )
        return None
    if _world.torchcomms_mode():
        raise CommStateError(
            "init_process_group: already initialised with use_torchcomms=True; call "
            "destroy_process_group() first"
        )
    _dist.init_process_group(
        _world.c10d_backend(backend),
        init_method,
        timeout,
        world_size,
        rank,
        store,
        group_name,
        pg_options,
        device_id,
    )
    return None


def destroy_process_group(group: Any = None) -> None:
    """Destroy ``group``, or with ``None`` every group (finalizing their communicators)."""
    if _world.torchcomms_mode() or isinstance(group, TorchCommsGroup):
        _world.destroy(group)
        return None
    _dist.destroy_process_group(group)
    return None


def new_group(
    ranks: list[int] | None = None,
    timeout: timedelta | None = None,
    backend: Any = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
) -> Any:
    """``torch.distributed.new_group``; refused in torchcomms mode (use :func:`split_group`)."""
    if _world.torchcomms_mode():
        raise CommStateError(
            "new_group is not available with use_torchcomms=True (torchcomms groups are "
            "split from their parent); call torchcomms.distwrap.split_group(parent_pg, "
            "split_ranks=[[...], ...]) instead"
        )
    return _dist.new_group(
        ranks,
        timeout,
        _world.c10d_backend(backend),
        pg_options,
        use_local_synchronization,
        group_desc,
        device_id,
    )


def split_group(
    parent_pg: Any = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: Any = None,
) -> Any:
    """Split ``parent_pg`` (default: the world) into the groups of ``split_ranks``.

    ``split_ranks`` lists group ranks of the parent; every parent member calls, and a rank
    in none of the lists gets ``None``.
    """
    parent = _world.resolve(parent_pg, "split_group")
    if parent is None:
        return _dist.split_group(
            parent_pg, split_ranks, timeout, pg_options, group_desc, _world.c10d_backend(backend)
        )
    return _world.split(parent, split_ranks or [], timeout, group_desc, backend)
