"""torchcomms-hier: a hierarchical communicator built of per-host backends.

``new_comm("hier", device, hints={"local_backend": ..., "global_backend": ...})`` groups the
ranks by host and runs every collective in two levels: inside each host on that host's
local backend, across hosts on the global backend. See docs/heterogeneous.md.
"""

from __future__ import annotations

from .backend import HierBackend
from .topology import HOST_ID_ENV, LOCAL_BACKEND_ENV, Topology

__all__ = ["HOST_ID_ENV", "LOCAL_BACKEND_ENV", "HierBackend", "Topology"]
