"""``--compare c10d``: the same operations through raw ``torch.distributed``, on the same engine.

A plain ``init_process_group`` on the store torchcomms rendezvouses through; timed A/B per call.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch

#: The ``torch.distributed`` backend that runs the same engine as each torchcomms backend.
C10D_BACKENDS: dict[str, str] = {
    "gloo": "gloo",
    "nccl": "nccl",
    "ncclx": "nccl",
    # ROCm builds of PyTorch run RCCL under the name "nccl".
    "rccl": "nccl",
}

#: What ``--compare`` accepts: torch.distributed, or raw mpi4py for the mpi backend.
COMPARE_WITH: tuple[str, ...] = ("c10d", "mpi4py")


def c10d_backend(backend: str) -> str:
    """The ``torch.distributed`` backend equivalent to torchcomms backend ``backend``."""
    try:
        return C10D_BACKENDS[backend]
    except KeyError:
        raise ValueError(
            f"--compare c10d needs a backend whose engine torch.distributed also runs "
            f"({', '.join(C10D_BACKENDS)}); backend {backend!r} has no such equivalent"
        ) from None


def init_c10d(
    backend: str, rank: int, nranks: int, device: torch.device, timeout: timedelta
) -> Any:
    """Create the default ``torch.distributed`` process group; returns ``torch.distributed``.

    It rendezvouses through the store torchcomms already uses, under its own prefix, so
    it works wherever ``new_comm`` does: local ranks, torchrun, mpiexec or SLURM.
    """
    import torch.distributed as dist
    from torch._C._distributed_c10d import PrefixStore

    from torchcomms_core.creation.bootstrap import default_store

    if dist.is_initialized():
        raise RuntimeError(
            "--compare c10d: a torch.distributed default process group already "
            "exists in this process"
        )
    store = default_store(rank, nranks, timeout)
    extra: dict[str, Any] = {}
    if device.type != "cpu":
        # Binds the group to this rank's device, as a training script would.
        extra["device_id"] = device
    dist.init_process_group(
        c10d_backend(backend),
        store=PrefixStore("c10d", store),
        rank=rank,
        world_size=nranks,
        timeout=timeout,
        **extra,
    )
    return dist


def close_c10d(dist: Any) -> None:
    """Destroy the process group ``init_c10d`` created."""
    if dist.is_initialized():
        dist.destroy_process_group()


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    """``(q1, median, q3)`` of ``xs``; all three equal the value when there is only one."""
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, _q2, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, statistics.median(xs), q3
