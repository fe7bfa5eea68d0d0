"""hier's declared all_reduce algorithms, the size rule that picks one, and the algorithm of
its own between hosts (recursive doubling).

The algorithms (:data:`ALL_REDUCE_ALGORITHMS`):

- ``flat``: one all_reduce on the global level, which joins every rank (the global
  backend's own algorithm: gloo's ring, ``O(ranks)`` steps). One call, no local steps.
- ``recursive_doubling``: local reduce, recursive doubling between the hosts' leaders
  (``ceil(log2 H)`` exchanges, plus one before and one after when ``H`` is not a power of
  two), local broadcast (both skipped on hosts of one rank). Exact, and bit-identical on
  every rank. The size rule's choice for small messages.
- ``levels``: local reduce, all_reduce of the leaders on the global backend, local broadcast.
- ``pipelined``: (even hosts, several ranks per host) local reduce_scatter, rail
  all_reduce, local all_gather, in pieces that overlap (see ``pipeline``).

:func:`choose_all_reduce` is the one place that maps a message to an algorithm; the hint
``hier::all_reduce_algorithm`` forces one (``auto``, the default, applies the rule).

May import: torch, the standard library and ``torchcomms_core.plugin``; no other module of
the plugin.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    ELEMENTWISE_REDUCE,
    Algorithm,
    CommInputError,
    OpAlgorithms,
    Query,
    ReduceOp,
    TorchComm,
    TorchWork,
)

#: Every all_reduce algorithm hier declares, by name.
ALL_REDUCE_ALGORITHMS: tuple[str, ...] = ("flat", "recursive_doubling", "levels", "pipelined")
#: The hint that forces one of :data:`ALL_REDUCE_ALGORITHMS` (or ``auto``: the size rule).
ALGORITHM_HINT = "hier::all_reduce_algorithm"

#: all_reduce messages of at least this many bytes take local reduce_scatter, rail
#: all_reduce, local all_gather (when hosts are even); smaller ones reduce to the leaders.
#: Hint ``hier::rs_min_bytes`` changes it.
RS_MIN_BYTES_DEFAULT = 64 << 10

#: all_reduce messages of at most this many bytes are "small": at a few bytes a call's cost
#: is its round trips and its messages, so they take ``recursive_doubling`` (from
#: :data:`RD_MIN_HOSTS` hosts on), else ``flat`` (one call on the global level, which
#: already connects every rank). Hint ``hier::flat_max_bytes`` changes it (0: no message is
#: small).
FLAT_MAX_BYTES_DEFAULT = 4 << 10

#: Small messages take ``recursive_doubling`` from this many hosts on; ``None``: the rule
#: never picks it. Measured over gloo between network namespaces (docs/benchmarks.md), it
#: sends ``log2 H`` messages per leader where gloo's ring sends 12 per rank at 2 hosts and
#: 84 at 8 for 4 KiB, and was 1.6, 2.0 and 3.4 times as fast as gloo's all_reduce at 2, 4
#: and 8 hosts of one rank (4 KiB), as fast at 8 bytes. Hosts of several ranks add a local
#: reduce and broadcast through the local level, and still gained (3.7x at 4 x 2, 4 KiB).
RD_MIN_HOSTS: int | None = 2


@dataclasses.dataclass(frozen=True)
class AllReduceRule:
    """What :func:`choose_all_reduce` reads besides the message: the size limits and the
    forced algorithm (``None``: the size rule)."""

    flat_max_bytes: int
    rs_min_bytes: int
    forced: str | None


def parse_algorithm(value: str | None) -> str | None:
    """The algorithm hint ``hier::all_reduce_algorithm`` names (``None`` for ``auto``).

    Raises:
        CommInputError: the value names no declared algorithm.
    """
    name = (value or "auto").strip().lower()
    if name == "auto":
        return None
    if name not in ALL_REDUCE_ALGORITHMS:
        raise CommInputError(
            f"hint {ALGORITHM_HINT}={value!r} names no hier all_reduce algorithm; use auto "
            f"or one of {', '.join(ALL_REDUCE_ALGORITHMS)}"
        )
    return name


def choose_all_reduce(
    nbytes: int, count: int, nhosts: int, local_size: int, even: bool, rule: AllReduceRule
) -> str:
    """The algorithm of an all_reduce of ``count`` elements (``nbytes`` bytes) over
    ``nhosts`` hosts, this rank's holding ``local_size`` ranks (``even``: every host holds
    as many). ``pipelined`` needs even hosts of more than one rank and ``count >=
    local_size``; when forced where it cannot run, ``levels`` runs instead."""
    can_pipeline = even and local_size > 1 and count >= local_size
    forced = rule.forced
    if forced is not None:
        return "levels" if forced == "pipelined" and not can_pipeline else forced
    if nbytes <= rule.flat_max_bytes:
        if RD_MIN_HOSTS is not None and nhosts >= RD_MIN_HOSTS:
            return "recursive_doubling"
        return "flat"
    if can_pipeline and nbytes >= rule.rs_min_bytes:
        return "pipelined"
    return "levels"


def _all_reduce_rule(backend: Any, query: Query) -> str:
    """recursive_doubling up to hier::flat_max_bytes (4 KiB), pipelined from
    hier::rs_min_bytes (64 KiB) on even hosts, levels otherwise; hier::all_reduce_algorithm
    forces one"""
    topo = backend._ready.topology
    count = max(1, query.nbytes // max(1, query.dtype.itemsize))
    return choose_all_reduce(
        query.nbytes, count, topo.nhosts, topo.local_size, topo.even, backend._settings.rule
    )


#: ``HierBackend.algorithms``: what a tuner may choose between for all_reduce (#45). The
#: default rule is :func:`choose_all_reduce`'s; any of hier's own size or algorithm hints
#: decides instead of the tuner.
ALGORITHMS = {
    "all_reduce": OpAlgorithms(
        (
            Algorithm("flat", doc="one all_reduce on the global level"),
            Algorithm(
                "recursive_doubling",
                doc="local reduce, recursive doubling between the hosts' leaders, local broadcast",
            ),
            Algorithm("levels", doc="local reduce, leaders' all_reduce, local broadcast"),
            Algorithm(
                "pipelined",
                doc="local reduce_scatter, rail all_reduce, local all_gather (even hosts)",
            ),
        ),
        default=_all_reduce_rule,
        forced_by=("hier::flat_max_bytes", "hier::rs_min_bytes", ALGORITHM_HINT),
    )
}


def recursive_doubling_all_reduce(
    comm: TorchComm, tensor: torch.Tensor, op: ReduceOp, timeout: timedelta | None
) -> None:
    """All-reduce ``tensor`` in place over ``comm`` by recursive doubling, with its
    point-to-point calls.

    With ``p`` the largest power of two up to the size ``n``: ranks ``p .. n-1`` first hand
    their data to rank ``r - p``; ranks ``0 .. p-1`` then exchange with the rank whose index
    differs in bit ``k``, for ``k = 0 .. log2(p) - 1``, each reducing what it holds with what
    it receives; ranks ``r - p`` finally send the result back. The two partners of an
    exchange compute ``a op b`` and ``b op a``, equal bit for bit for every reduction
    (IEEE addition and multiplication commute), so every rank ends with the same bits.

    Every receive of the call is posted before its first send, each into a buffer of its
    own: a pair exchanges one message per call, so nothing can match the wrong receive.
    A message that reaches gloo before its receive is posted is not read until then, and
    its readable socket keeps gloo's event loop spinning meanwhile: at 8 ranks on one
    host, receives posted one step at a time took 6.2 ms a call and 1.5 ms of CPU per rank,
    posted first 2.2 ms and 0.47 ms (docs/benchmarks.md).

    While nothing observes ``comm`` (:meth:`TorchComm.takes_lean_calls`: usable, no hooks,
    no call checking; asked on every call), the sends and receives go to its backend
    directly: the communicator's checks and work handles cost each rank 130-240 us of CPU
    per call at 8 hosts of one rank, a fifth to a third of its CPU (docs/benchmarks.md).
    What the communicator adds is kept: its default timeout applies, and an engine failure is
    classified through it (it marks itself failed, and a timeout is raised as
    ``CommTimeoutError``) as its own calls' would be. A communicator with hooks (a flight
    recorder) gets the calls itself, so its hooks see each of them.
    """
    n, me = comm.get_size(), comm.get_rank()
    if n == 1:
        return
    limit = comm.get_timeout() if timeout is None else timeout
    target = comm.get_backend_impl() if comm.takes_lean_calls() else comm
    try:
        _exchange(target, n, me, tensor, ELEMENTWISE_REDUCE[op.type], limit)
    except Exception as exc:
        error = TorchWork.failed(exc, comm, "all_reduce").error
        if error is None or error is exc:
            raise
        raise error from exc


def _exchange(
    backend: Any, n: int, me: int, tensor: torch.Tensor, combine: Any, timeout: timedelta
) -> None:
    """The steps of :func:`recursive_doubling_all_reduce` on rank ``me`` of ``n``, through
    ``backend``: a communicator or its backend (the same positional ``async_op``)."""
    p = 1 << (n.bit_length() - 1)
    if me >= p:  # folded into rank me - p: hand over, wait for the result
        back = backend.recv(tensor, me - p, True, timeout=timeout)
        backend.send(tensor, me - p, False, timeout=timeout)  # the result comes after it is read
        back.wait()
        return
    folded = me + p < n
    partners = [me ^ (1 << k) for k in range(p.bit_length() - 1)]
    incoming = torch.empty(
        (len(partners) + folded,) + tuple(tensor.shape), dtype=tensor.dtype, device=tensor.device
    )
    recvs = [
        backend.recv(incoming[k], partner, True, timeout=timeout)
        for k, partner in enumerate(partners)
    ]
    if folded:
        backend.recv(incoming[-1], me + p, False, timeout=timeout)
        combine(tensor, incoming[-1], out=tensor)
    for k, partner in enumerate(partners):
        sent = backend.send(tensor, partner, True, timeout=timeout)
        recvs[k].wait()
        if sent is not None:
            sent.wait()  # the outgoing data must leave before it is overwritten
        combine(tensor, incoming[k], out=tensor)
    if folded:
        backend.send(tensor, me + p, False, timeout=timeout)
