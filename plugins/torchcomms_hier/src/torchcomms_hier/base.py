"""What a hier communicator is built of: its level communicators and its settings.

:class:`~torchcomms_hier.HierBackend` creates both (``backend``) and hands them to the part
that runs its collectives (``collectives``); neither part reaches into the other.

May import: torch, ``torchcomms_core.plugin`` and this package's ``algorithms``, ``codec``
and ``topology``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchcomms_core.plugin import TorchComm

from .algorithms import FLAT_MAX_BYTES_DEFAULT, RS_MIN_BYTES_DEFAULT, AllReduceRule
from .codec import CODEC_NONE
from .topology import Topology


def done(work: Any, async_op: bool) -> Any:
    """What an operation returns: the level's work when asynchronous, else ``None``."""
    return work if async_op else None


@dataclasses.dataclass(frozen=True)
class HierSettings:
    """How a hier communicator crosses between hosts; a child of ``split`` keeps its
    parent's."""

    #: Where the cross-host steps run: the communicator's device, or host memory where the
    #: global backend cannot use it.
    cross_device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    #: How all_reduce picks its algorithm (sizes and the forcing hint).
    rule: AllReduceRule = dataclasses.field(
        default_factory=lambda: AllReduceRule(FLAT_MAX_BYTES_DEFAULT, RS_MIN_BYTES_DEFAULT, None)
    )
    #: What crosses between hosts in all_reduce and reduce_scatter (hint ``global_codec``).
    codec: str = CODEC_NONE


@dataclasses.dataclass(frozen=True)
class HierLevels:
    """This rank's level communicators and the topology they were made from."""

    topology: Topology
    #: The ranks of this host.
    local: TorchComm
    #: This rank's rail (even hosts): the ranks of its local index on every host.
    rail: TorchComm | None = None
    #: Local rank 0 of every host (uneven hosts only; with even hosts rail 0 plays it).
    leaders: TorchComm | None = None
    #: Every rank on the global backend, for point-to-point between hosts.
    global_comm: TorchComm | None = None

    def cross(self) -> TorchComm | None:
        """The cross-host level this rank joins: its rail, or the leaders (local rank 0)."""
        return self.rail if self.rail is not None else self.leaders

    def by_role(self) -> dict[str, TorchComm]:
        """The levels this rank belongs to by role (``local``, ``rail``, ``leaders``,
        ``global``), in the order they were created."""
        found = {
            "local": self.local,
            "rail": self.rail,
            "leaders": self.leaders,
            "global": self.global_comm,
        }
        return {role: comm for role, comm in found.items() if comm is not None}
