"""The shm backend's choices, declared for tuners (#45), and its default rules.

- ``arena`` (asked once, inside ``init``, before the ranks agree on a tuner: the default
  or a forcing hint decides): the staging arena's bytes per rank (hint ``arena_bytes``,
  or ``algorithm.arena=arena`` with ``algorithm.arena.arena_bytes``);
- ``all_reduce``: ``one_step`` (every rank stages its tensor, a piece of half a slot per
  step, and folds every rank's copy of the piece itself, in rank order), ``chunked`` (each
  rank reduces its part of each chunk, lockstep),
  ``direct`` (each rank reads its part of every peer's tensor, reduces it in rank order,
  then reads the peers' reduced parts: cross-memory reads, one copy per byte moved), or
  ``measured`` (``chunked`` or ``direct`` per call, as for broadcast below). Default:
  ``one_step`` at every size for 2 ranks and up to ``one_step_limit(ranks)`` above (1 MiB
  for 4 ranks, 585 KiB for 8), then ``measured`` from 1 MiB where every rank can read its
  peers, ``chunked`` otherwise;
- ``all_to_all_single`` (even splits): ``staged`` through the arena, or ``direct`` reads of
  each block from its owner's tensor (cross-memory attach; when every rank can read its
  peers). Hint ``cma_bytes`` decides when given.

- ``broadcast`` and ``all_gather``: ``staged`` through the arena (the owner copies each
  chunk in, every reader copies it out: two copies, a step per chunk) or ``direct``: each
  reader copies straight from the owner's tensor (``process_vm_readv``: one copy, two
  lockstep steps in all; when every rank can read its peers), or ``measured``: one of
  the two per call, as rank 0's times of recent calls of the size say
  (``torchcomms_shm.measured``). Default: ``measured`` from 1 MiB where every rank can
  read its peers, else ``staged``: on the machine the defaults were measured on, staging
  ran at twice a kernel copy in one state and half of it in another, from one second to
  the next. ``algorithm.broadcast=direct`` (or ``staged``, ``measured``) forces one.

Messages of at most ``small_bytes`` that stay ``one_step``/``staged`` run through
memoryviews (``torchcomms_shm.small``): the same bytes in the same places, without torch
operators.

``nbytes`` of a query: the tensor's bytes (all_reduce, broadcast), the output's bytes
(all_gather), one block's bytes (all_to_all_single).
"""

from __future__ import annotations

from typing import Any

from torchcomms_core.plugin import Algorithm, OpAlgorithms, Query

from .collectives import SMALL_BYTES

__all__ = ["ALGORITHMS", "ONE_STEP_BYTES", "one_step_limit"]

#: all_reduce messages of at most this many bytes take one step at any rank count.
ONE_STEP_BYTES = SMALL_BYTES
#: One step reads every peer's copy, ``(ranks - 1) x bytes`` per rank; the default gives it
#: to messages up to this many bytes of peers' data, and to every size at 2 ranks, where
#: it was fastest at every size from 8 bytes to 64 MiB. Measured with
#: ``benchmarks/shm_allreduce_sweep.py`` on 2 cores: one step against the chunked and
#: measured paths was 0.84-1.0x up to 1 MiB at 4 ranks, 1.04x at 4 MiB, 1.5-1.6x from
#: 16 MiB (docs/benchmarks.md). ``torchcomms tune --backend shm`` measures a host's own.
ONE_STEP_TRAFFIC_BYTES = 4 << 20
#: all_reduce, broadcast and all_gather messages of at least this many bytes take
#: ``measured`` (where every rank can read its peers).
MEASURED_MIN_BYTES = 1 << 20


def one_step_limit(ranks: int) -> int:
    """The largest all_reduce (bytes) the default rule gives one step, for ``ranks`` ranks:
    any size for 2, else ``ONE_STEP_TRAFFIC_BYTES / (ranks - 1)``, at least 64 KiB."""
    if ranks <= 2:
        return 1 << 62
    return max(ONE_STEP_BYTES, ONE_STEP_TRAFFIC_BYTES // (ranks - 1))


def _all_reduce_rule(backend: Any, query: Query) -> str:
    """one_step up to one_step_limit(ranks) (any size for 2 ranks, 1 MiB for 4), measured
    above where every rank can read its peers, chunked otherwise"""
    if query.nbytes <= one_step_limit(getattr(backend, "_size", 2)):
        return "one_step"
    if getattr(backend, "_cma_ok", False) and query.nbytes >= MEASURED_MIN_BYTES:
        return "measured"
    return "chunked"


def _all_to_all_rule(backend: Any, query: Query) -> str:
    """direct from cma_bytes per block (1 MiB with more ranks than cores, else never),
    staged below"""
    cma = getattr(backend, "_cma", 0)
    return "direct" if cma and query.nbytes >= cma else "staged"


def _copy_once_rule(backend: Any, query: Query) -> str:
    """measured from 1 MiB where every rank can read its peers, staged below"""
    can_read = getattr(backend, "_cma_ok", False)
    return "measured" if can_read and query.nbytes >= MEASURED_MIN_BYTES else "staged"


def _copy_once_algorithms(what: str) -> OpAlgorithms:
    return OpAlgorithms(
        (
            Algorithm("staged", doc=f"{what} through the arena, a step per chunk"),
            Algorithm("direct", doc="readers copy from the owner's tensor (cross-memory attach)"),
            Algorithm(
                "measured",
                doc="staged or direct, as rank 0's times of recent calls of the size say",
            ),
        ),
        default=_copy_once_rule,
    )


#: ``ShmBackend.algorithms``.
ALGORITHMS = {
    "arena": OpAlgorithms(
        (Algorithm("arena", {"arena_bytes": 1 << 20}, doc="staging bytes per rank, two halves"),),
        default="arena",
        forced_by=("arena_bytes",),
    ),
    "all_reduce": OpAlgorithms(
        (
            Algorithm("one_step", doc="stage each piece, every rank folds every rank's copy"),
            Algorithm("chunked", doc="per chunk, each rank reduces its part; lockstep"),
            Algorithm(
                "direct",
                doc="each rank reads its part of every peer's tensor (cross-memory attach), "
                "reduces it, then reads the peers' reduced parts",
            ),
            Algorithm(
                "measured",
                doc="chunked or direct, as rank 0's times of recent calls of the size say",
            ),
        ),
        default=_all_reduce_rule,
    ),
    "all_to_all_single": OpAlgorithms(
        (
            Algorithm("staged", doc="blocks through the arena, a step per chunk"),
            Algorithm("direct", doc="read each block from its owner (cross-memory attach)"),
        ),
        default=_all_to_all_rule,
        forced_by=("cma_bytes",),
    ),
    "broadcast": _copy_once_algorithms("the root's tensor"),
    "all_gather": _copy_once_algorithms("every rank's block"),
}
