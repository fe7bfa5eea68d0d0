"""What the agent keeps and how fast it polls: its registrations (``Region``), what it knows
of each peer (``Peer``), the releases under way (``Release``) and the timing constants.

Plain records with no behaviour beyond their own checks; imports nothing of the plugin.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

import torch

#: How often the service thread polls (each poll progresses UCX): every
#: ``engine.progress_us()`` for ``ACTIVE_S`` after the last sign of traffic (a
#: notification in, a transfer out), else every ``POLL_QUIET_S`` while a peer is connected
#: and ``POLL_IDLE_S`` while none is.
ACTIVE_S = 1.0
POLL_QUIET_S = 0.002
POLL_IDLE_S = 0.005
#: A transfer first tells a target that has not heard from this process for this many
#: seconds to poll quickly (a ``wake``), since a target over TCP must take part.
NUDGE_S = 0.5
#: Seconds a transfer is polled flat out before the poll yields the CPU, then naps.
SPIN_S = 0.0002
NAP_S = 0.00005
#: Prepared transfers kept for reposting (NIXL reposts one in a few microseconds).
HANDLE_CACHE = 128
#: Default seconds to wait for revocation answers (``TORCHCOMM_TIMEOUT_SECONDS`` if set).
DEFAULT_TIMEOUT_S = 600.0


def default_timeout_s() -> float:
    """Seconds to wait for revocation answers: ``TORCHCOMM_TIMEOUT_SECONDS``, else 600."""
    try:
        return float(os.environ.get("TORCHCOMM_TIMEOUT_SECONDS", "") or DEFAULT_TIMEOUT_S)
    except ValueError:
        return DEFAULT_TIMEOUT_S


def memory_of(tensor: torch.Tensor) -> tuple[str, int]:
    """NIXL's memory type and device id of ``tensor``'s memory."""
    if tensor.device.type == "cuda":
        return "VRAM", tensor.device.index or 0
    return "DRAM", 0


@dataclasses.dataclass(eq=False)
class Region:
    """Memory registered with NIXL; ``tensor`` keeps it alive until it is deregistered."""

    ident: int
    base: int
    nbytes: int
    mem_type: str
    device_id: int
    descs: Any
    tensor: torch.Tensor | None
    refs: int = 1
    metadata: bytes | None = None

    def covers(self, addr: int, nbytes: int, mem_type: str, device_id: int) -> bool:
        """Whether this live registration holds ``nbytes`` at ``addr`` of that memory."""
        return (
            self.tensor is not None
            and (mem_type, device_id) == (self.mem_type, self.device_id)
            and self.base <= addr
            and addr + nbytes <= self.base + self.nbytes
            # A storage resized under the registration no longer owns these addresses.
            and self.tensor.untyped_storage().nbytes() > 0
        )


@dataclasses.dataclass(eq=False)
class Peer:
    """What this agent knows of another agent's exposures."""

    live: frozenset[int] | None = None  # from its first hello; None until then
    next_exposure: int = 0
    revoked: set[int] = dataclasses.field(default_factory=set)
    loaded: set[int] = dataclasses.field(default_factory=set)  # exposures whose metadata is in
    dead: bool = False

    def allows(self, exposure: int) -> bool:
        """Whether a key to the peer's ``exposure`` is still valid (live, not revoked)."""
        if self.live is None or exposure in self.revoked:
            return False
        return exposure in self.live or exposure >= self.next_exposure


@dataclasses.dataclass(eq=False)
class Release:
    """A registration being released: who must still answer, until when, what follows."""

    exposure: int | None
    region: Region
    waiting: set[str]
    deadline: float
    done: threading.Event
