"""The algorithms of hier's all_reduce and its default rule (#45).

- ``flat``: one all_reduce on the global level (every rank already connected): at a few
  bytes a call's cost is its round trips;
- ``reduce_scatter``: local reduce_scatter, rail all_reduce, local all_gather, pipelined
  (hosts with the same number of ranks; otherwise ``leaders`` runs);
- ``leaders``: local reduce, all_reduce among the hosts' leaders, local broadcast.

The default rule keeps the hints ``hier::flat_max_bytes`` and ``hier::rs_min_bytes``;
when a communicator has either, it decides instead of the tuner.
"""

from __future__ import annotations

from typing import Any

from torchcomms_core.plugin import Algorithm, OpAlgorithms, Query

__all__ = ["ALGORITHMS", "FLAT_MAX_BYTES_DEFAULT", "RS_MIN_BYTES_DEFAULT"]

#: all_reduce messages of at least this many bytes take local reduce_scatter, rail
#: all_reduce, local all_gather (when hosts are even); smaller ones reduce to the leaders.
#: Hint ``hier::rs_min_bytes`` changes it.
RS_MIN_BYTES_DEFAULT = 64 << 10

#: all_reduce messages of at most this many bytes run in one step on the global level,
#: which already connects every rank: at a few bytes a call's cost is its round trips, and
#: three levels in turn cost three. Hint ``hier::flat_max_bytes`` changes it (0: never).
FLAT_MAX_BYTES_DEFAULT = 4 << 10


def _all_reduce_rule(backend: Any, query: Query) -> str:
    """flat up to hier::flat_max_bytes (4 KiB), reduce_scatter from hier::rs_min_bytes
    (64 KiB), leaders between"""
    if query.nbytes <= getattr(backend, "_flat_max_bytes", FLAT_MAX_BYTES_DEFAULT):
        return "flat"
    if query.nbytes >= getattr(backend, "_rs_min_bytes", RS_MIN_BYTES_DEFAULT):
        return "reduce_scatter"
    return "leaders"


#: ``HierBackend.algorithms``.
ALGORITHMS = {
    "all_reduce": OpAlgorithms(
        (
            Algorithm("flat", doc="one all_reduce on the global level"),
            Algorithm(
                "reduce_scatter",
                doc="local reduce_scatter, rail all_reduce, local all_gather (even hosts)",
            ),
            Algorithm("leaders", doc="local reduce, leaders' all_reduce, local broadcast"),
        ),
        default=_all_reduce_rule,
        forced_by=("hier::flat_max_bytes", "hier::rs_min_bytes"),
    )
}
