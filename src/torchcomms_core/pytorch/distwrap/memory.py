"""distwrap's memory and window calls, and the PREMUL_SUM operator.

``get_mem_allocator``/``register_mem_pool`` reach the communicator's backend (torchcomms
registers memory itself, so ``register_mem_pool`` does nothing there); ``new_window``
exists only on torchcomms groups.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.operations.reduce_op import ReduceOp as CommsReduceOp
from torchcomms_core.pytorch.distwrap.world import resolve, torchcomms_mode


def _device(device: Any) -> torch.device:
    return torch.device(device if device is not None else "cuda")


def get_mem_allocator(group: Any, device: Any) -> Any:
    """The allocator of ``group``'s backend on ``device`` (for ``torch.cuda.MemPool``)."""
    pg = resolve(group, "get_mem_allocator")
    if pg is None:
        target: Any = group if group is not None else dist.group.WORLD
        return target._get_backend(_device(device)).mem_allocator
    return pg.comm_for(_device(device), "get_mem_allocator").get_mem_allocator()


def register_mem_pool(group: Any, device: Any, pool: Any) -> None:
    """Register ``pool``'s memory with ``group``'s backend (nothing to do on torchcomms)."""
    pg = resolve(group, "register_mem_pool")
    if pg is None:
        target: Any = group if group is not None else dist.group.WORLD
        target._get_backend(_device(device)).register_mem_pool(pool)
    return None


def new_window(group: Any = None, backend: Any = None) -> Any:
    """A one-sided window on ``group``'s communicator (torchcomms groups only)."""
    pg = resolve(group, "new_window")
    if pg is None:
        raise CommInputError(
            "new_window needs a group made by init_process_group(..., use_torchcomms=True) "
            "(torch.distributed's own groups have no torchcomms windows)"
        )
    if backend is None:
        comm = pg.default_comm
    else:
        matches = [c for c in pg.comms.values() if c.get_backend() == str(backend)]
        if not matches:
            have = ", ".join(c.get_backend() for c in pg.comms.values())
            raise CommInputError(
                f"new_window: group {pg.group_name!r} has no {backend!r} communicator "
                f"(it has {have})"
            )
        comm = matches[0]
    return comm.new_window()


def _make_nccl_premul_sum(mul_factor: float | torch.Tensor) -> Any:
    """``PREMUL_SUM(mul_factor)``: torchcomms' operator in torchcomms mode, else c10d's."""
    if torchcomms_mode():
        return CommsReduceOp.PREMUL_SUM(mul_factor)
    from torch._C._distributed_c10d import _make_nccl_premul_sum as c10d_premul_sum

    return c10d_premul_sum(mul_factor)
