"""torchcomms-hier: a hierarchical communicator built of per-host backends.

``new_comm("hier", device, hints={"local_backend": ..., "global_backend": ...})`` groups the
ranks by host and runs every collective in two levels: inside each host on that host's
local backend, across hosts on the global backend. See docs/heterogeneous.md.
"""

from __future__ import annotations

from .algorithms import ALGORITHM_HINT, ALL_REDUCE_ALGORITHMS, choose_all_reduce
from .backend import HierBackend
from .codec import (
    CODEC_HINT,
    CODECS,
    global_codec_error_bound,
    global_codec_reduce_scatter_error_bound,
)
from .topology import HOST_ID_ENV, LOCAL_BACKEND_ENV, Topology

__all__ = [
    "ALGORITHM_HINT",
    "ALL_REDUCE_ALGORITHMS",
    "CODECS",
    "CODEC_HINT",
    "HOST_ID_ENV",
    "LOCAL_BACKEND_ENV",
    "HierBackend",
    "Topology",
    "choose_all_reduce",
    "global_codec_error_bound",
    "global_codec_reduce_scatter_error_bound",
]
