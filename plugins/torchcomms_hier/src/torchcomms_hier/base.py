"""The state every part of :class:`~torchcomms_hier.HierBackend` reads: its levels, its
settings, and the helpers that move data between them.

``collectives`` builds the collectives on it and ``backend`` the lifecycle, the lean lane
and point-to-point; both read the fields set here.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import StoredRankAndSize, TorchComm, TorchCommBackend

from .algorithms import FLAT_MAX_BYTES_DEFAULT, RS_MIN_BYTES_DEFAULT, AllReduceRule
from .codec import CODEC_NONE
from .pipeline import pipelined_gather
from .topology import Topology


def done(work: Any, async_op: bool) -> Any:
    """What an operation returns: the level's work when asynchronous, else ``None``."""
    return work if async_op else None


class HierBase(StoredRankAndSize, TorchCommBackend):
    """The levels and settings of a hier communicator, and the helpers between levels."""

    def __init__(self) -> None:
        self.topology: Topology | None = None
        #: The ranks of this host.
        self.local: TorchComm | None = None
        #: This rank's rail (even hosts): the ranks of its local index on every host.
        self.rail: TorchComm | None = None
        #: Local rank 0 of every host (uneven hosts only; with even hosts rail 0 plays it).
        self.leaders: TorchComm | None = None
        #: Every rank on the global backend, for point-to-point between hosts.
        self.global_comm: TorchComm | None = None
        self._rank = -1
        self._size = -1
        self._cross_device = torch.device("cpu")
        #: How all_reduce picks its algorithm (sizes and the forcing hint).
        self._rule = AllReduceRule(FLAT_MAX_BYTES_DEFAULT, RS_MIN_BYTES_DEFAULT, None)
        #: What crosses between hosts in all_reduce and reduce_scatter (hint global_codec).
        self._codec = CODEC_NONE

    def _copy_settings(self, other: HierBase) -> None:
        """Take ``other``'s settings (a child of ``split`` keeps its parent's)."""
        self._cross_device = other._cross_device
        self._rule = other._rule
        self._codec = other._codec

    @property
    def _topo(self) -> Topology:
        assert self.topology is not None, "HierBackend used before init"
        return self.topology

    @property
    def _local(self) -> TorchComm:
        assert self.local is not None, "HierBackend used before init"
        return self.local

    def _cross(self) -> TorchComm | None:
        """The cross-host level this rank joins: its rail, or the leaders (local rank 0)."""
        return self.rail if self.rail is not None else self.leaders

    def _cross_index(self, local_index: int) -> int:
        """The local index whose ranks carry a cross-host step rooted at ``local_index``."""
        return local_index if self._topo.even else 0

    def _staged(
        self, tensor: torch.Tensor, step: Callable[[torch.Tensor], object], read: bool = True
    ) -> None:
        """Run ``step`` on ``tensor`` on the cross-host device (host memory when it differs)."""
        if tensor.device == self._cross_device:
            step(tensor)
            return
        host = (
            tensor.to(self._cross_device)
            if read
            else torch.empty(tensor.shape, dtype=tensor.dtype, device=self._cross_device)
        )
        step(host)
        tensor.copy_(host)

    def _perm(self, host_major: bool, device: torch.device) -> torch.Tensor:
        """Global ranks in ``[host][local]`` order (uneven) or ``[local][host]`` (even)."""
        topo = self._topo
        if host_major:
            order = [r for members in topo.hosts for r in members]
        else:
            order = [
                topo.rank_of(h, j) for j in range(len(topo.hosts[0])) for h in range(topo.nhosts)
            ]
        return torch.tensor(order, dtype=torch.long, device=device)

    def _pipelined_gather(
        self, flat: torch.Tensor, dests: list[torch.Tensor], timeout: timedelta | None
    ) -> None:
        """Even hosts: :func:`~torchcomms_hier.pipeline.pipelined_gather` over this rank's
        rail and host; ``dests[r]`` (flat) receives rank ``r``'s ``flat``."""
        cross = self._cross()
        assert cross is not None
        order = self._perm(host_major=False, device=torch.device("cpu")).tolist()
        pipelined_gather(
            self._local, cross, flat, dests, order, self._topo.nhosts, self._cross_device, timeout
        )
