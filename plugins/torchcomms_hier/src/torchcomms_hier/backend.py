"""``HierBackend``: one communicator over per-host backends, in levels.

Levels are ordinary communicators made with ``new_member_comm`` of their backends:

- ``local``: the ranks of this host, on the host's local backend (name ``<name>.local<h>``);
- ``rail``: when every host holds the same number of ranks, the ranks of this local index on
  every host, on the global backend (``<name>.rail<j>``); rail 0 joins the hosts' leaders;
- ``leaders``: when hosts are uneven, local rank 0 of every host (``<name>.leaders``);
- ``global``: every rank, on the global backend (``<name>.global``); it carries
  point-to-point traffic between hosts and small all_reduces, and connects each pair of
  ranks on first use when its backend reads a ``lazy`` hint (gloo; hint
  ``hier::lazy_global``, default true).

Collectives run their intra-host steps on ``local`` and only one share per host crosses
between hosts. When the global backend cannot use the communicator's device (``cuda``
locally, ``gloo`` between hosts), the cross-host steps are staged through host buffers.

This module holds the lifecycle (levels, ``split``), the core's lean lane and
point-to-point. The collectives run in a part the backend holds,
:class:`~torchcomms_hier.collectives.HierCollectives`, made with the levels and settings
(``base``) once ``init`` or ``split`` created them; ``algorithms`` holds the all_reduce
algorithms and their size rule, ``codec`` the quantized hop between hosts (hint
``global_codec``).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ClassVar

import torch
from torch._C._distributed_c10d import PrefixStore

from torchcomms_core.plugin import (
    CommOptions,
    ReduceOp,
    StoredRankAndSize,
    TorchComm,
    TorchCommBackend,
    bool_hint,
    get_backend_class,
    int_hint,
    new_member_comm,
    then,
)

from .algorithms import (
    ALGORITHM_HINT,
    ALGORITHMS,
    ALL_REDUCE_ALGORITHMS,
    FLAT_MAX_BYTES_DEFAULT,
    RS_MIN_BYTES_DEFAULT,
    AllReduceRule,
    parse_algorithm,
)
from .base import HierLevels, HierSettings, done
from .codec import CODEC_BLOCK_SIZE, CODEC_HINT
from .collectives import HierCollectives
from .pipeline import PIECE_BYTES, PIPELINE_MAX_PIECES
from .topology import Topology, exchange, resolve_settings

__all__ = [
    "ALL_REDUCE_ALGORITHMS",
    "FLAT_MAX_BYTES_DEFAULT",
    "HIER_DTYPES",
    "LAZY_HINT",
    "PIECE_BYTES",
    "PIPELINE_MAX_PIECES",
    "RS_MIN_BYTES_DEFAULT",
    "HierBackend",
]

#: The hint a global backend reads to connect its peers on first use (gloo's ``lazy``);
#: hier passes it to the global level unless hint ``hier::lazy_global`` is false.
LAZY_HINT = "lazy"

#: Element types every level can carry (gloo, the default global level, has no int16).
HIER_DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.bool,
)


class HierBackend(StoredRankAndSize, TorchCommBackend):
    """A hierarchical backend: each host on its own local backend, hosts joined by a global one.

    ``comm.get_backend_impl()`` is this object; :meth:`levels` returns its communicators.
    """

    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = HIER_DTYPES
    #: all_reduce: flat, recursive_doubling, levels or pipelined, for a tuner (#45).
    algorithms = ALGORITHMS
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        "local_backend",
        "global_backend",
        "host_id",
        "hier::rs_min_bytes",
        "hier::flat_max_bytes",
        "hier::lazy_global",
        ALGORITHM_HINT,
        CODEC_HINT,
    )

    #: The part that runs the collectives on the levels (set with them by ``init``/``split``).
    _collectives: HierCollectives

    def __init__(self) -> None:
        self._rank = -1
        self._size = -1
        self._settings = HierSettings()
        self._levels: HierLevels | None = None
        #: The hosts, their ids and backends (``None`` before ``init``).
        self.topology: Topology | None = None
        #: The ranks of this host.
        self.local: TorchComm | None = None
        #: This rank's rail (even hosts): the ranks of its local index on every host.
        self.rail: TorchComm | None = None
        #: Local rank 0 of every host (uneven hosts only; with even hosts rail 0 plays it).
        self.leaders: TorchComm | None = None
        #: Every rank on the global backend, for point-to-point between hosts.
        self.global_comm: TorchComm | None = None

    def _attach(self, levels: HierLevels) -> None:
        """Take ``levels`` (also as the attributes above) and make the collectives' part on
        them."""
        self._levels = levels
        self.topology, self.local, self.rail, self.leaders, self.global_comm = (
            levels.topology,
            levels.local,
            levels.rail,
            levels.leaders,
            levels.global_comm,
        )
        self._collectives = HierCollectives(
            levels, self._settings, self._rank, self._size, self.tuning.choose
        )

    @property
    def _ready(self) -> HierLevels:
        assert self._levels is not None, "HierBackend used before init"
        return self._levels

    # -- lifecycle --------------------------------------------------------------------

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        """Exchange every rank's host and backends, then create the levels."""
        self._rank, self._size = options.rank, options.size
        hints = dict(options.hints)
        rule = AllReduceRule(
            int_hint(hints, "hier::flat_max_bytes", FLAT_MAX_BYTES_DEFAULT),
            int_hint(hints, "hier::rs_min_bytes", RS_MIN_BYTES_DEFAULT),
            parse_algorithm(hints.get(ALGORITHM_HINT)),
        )
        lazy_global = bool_hint(hints, "hier::lazy_global", True)
        settings = resolve_settings(hints, device)
        topo = exchange(
            options.store, self._rank, self._size, options.timeout, settings, device, name
        )
        global_cls = get_backend_class(topo.global_backend)
        # Cross-host levels run where the global backend can; otherwise through host memory.
        cross_device = device if device.type in global_cls.devices else torch.device("cpu")
        self._settings = HierSettings(cross_device, rule, settings.codec)
        created: list[TorchComm] = []
        rail = leaders = global_comm = None
        try:
            h, j = topo.host, topo.local_rank
            local = self._level(
                topo.local_backends[h], device, f"{name}.local{h}", j, topo.local_size, {}
            )
            created.append(local)
            if topo.nhosts > 1:
                if topo.even:
                    rail = self._level(
                        topo.global_backend, cross_device, f"{name}.rail{j}", h, topo.nhosts
                    )
                    created.append(rail)
                elif j == 0:
                    leaders = self._level(
                        topo.global_backend, cross_device, f"{name}.leaders", h, topo.nhosts
                    )
                    created.append(leaders)
                # Every pair of ranks connected on first use, when the global backend
                # can (gloo's ``lazy``): cross-host send/recv between two ranks connects
                # those two only, a small all_reduce the pairs its algorithm uses. A lazy
                # gloo pair blocks a receive whose sender never comes for the engine's
                # whole timeout (the level's, this communicator's default), not the call's.
                lazy = lazy_global and LAZY_HINT in (global_cls.hint_keys or ())
                global_comm = self._level(
                    topo.global_backend,
                    cross_device,
                    f"{name}.global",
                    self._rank,
                    self._size,
                    {LAZY_HINT: "true"} if lazy else None,
                )
                created.append(global_comm)
        except BaseException:
            for comm in reversed(created):
                comm.abort()
            raise
        self._attach(HierLevels(topo, local, rail, leaders, global_comm))

    def _level(
        self,
        backend: str,
        device: torch.device,
        name: str,
        rank: int,
        size: int,
        hints: dict[str, str] | None = None,
    ) -> TorchComm:
        return new_member_comm(
            backend,
            device,
            name=name,
            store=PrefixStore(f"hier/{name}", self.options.store),
            rank=rank,
            size=size,
            timeout=self.options.timeout,
            hints=hints or None,
            abort_process_on_timeout_or_error=False,
        )

    def split(self, ranks: list[int], name: str, options: CommOptions) -> HierBackend | None:
        """Split every level: the host's local level among its members, the global level
        into the child's rails (or leaders) and its global level. Every parent rank takes
        part (non-members with ``[]``); the child keeps each level's backend."""
        parent = self._ready
        topo = parent.topology
        member = self._rank in ranks
        child_hosts = [
            tuple(ranks.index(r) for r in members if r in ranks) for members in topo.hosts
        ]
        kept = [(h, m) for h, m in enumerate(child_hosts) if m]
        kept.sort(key=lambda item: item[1][0])
        child_topo = Topology(
            rank=ranks.index(self._rank) if member else -1,
            hosts=tuple(m for _, m in kept),
            host_ids=tuple(topo.host_ids[h] for h, _ in kept),
            local_backends=tuple(topo.local_backends[h] for h, _ in kept),
            global_backend=topo.global_backend,
        )
        index = {h: i for i, (h, _) in enumerate(kept)}
        mine = child_hosts[topo.host]
        local = parent.local.split(
            [topo.locate(ranks[c])[1] for c in mine] if member else [],
            f"{name}.local{index.get(topo.host, 0)}",
        )
        rail = leaders = global_comm = None
        glob = parent.global_comm
        if glob is not None and child_topo.nhosts > 1:
            h_c, j_c = child_topo.locate(child_topo.rank) if member else (-1, -1)
            if child_topo.even:
                group = [ranks[child_topo.rank_of(h, j_c)] for h in range(child_topo.nhosts)]
                rail = glob.split(group if member else [], f"{name}.rail{j_c}")
            else:
                group = [ranks[m[0]] for m in child_topo.hosts]
                chosen = member and j_c == 0
                leaders = glob.split(group if chosen else [], f"{name}.leaders")
            global_comm = glob.split(list(ranks) if member else [], f"{name}.global")
        if not member:
            return None
        assert local is not None  # a member has a place on its host
        child = HierBackend()
        child._bind(self.device, name, options)
        child._rank, child._size = options.rank, options.size
        child._settings = self._settings
        child._attach(HierLevels(child_topo, local, rail, leaders, global_comm))
        return child

    def levels(self) -> dict[str, TorchComm]:
        """This rank's level communicators by role (``local``, ``rail``, ``leaders``,
        ``global``), those it belongs to only."""
        return {} if self._levels is None else self._levels.by_role()

    def finalize(self) -> None:
        """Finalize every level, the last created first."""
        for comm in reversed(list(self.levels().values())):
            comm.finalize()

    def abort(self) -> None:
        """Abort every level at once."""
        for comm in reversed(list(self.levels().values())):
            comm.abort()

    def get_backend_name(self) -> str:
        """``"hier"``."""
        return "hier"

    # -- the core's lean lane ---------------------------------------------------------

    def lean_calls(
        self, timeout: timedelta, hints: dict[str, str]
    ) -> dict[str, Callable[..., Any]]:
        """A blocking ``all_reduce`` for the core's lean lane: small messages straight into
        the global level's backend.

        An all_reduce whose algorithm is ``flat`` (the tuning's choice: by default up to
        ``hier::flat_max_bytes``) is one all_reduce on the global level (see
        :meth:`all_reduce`). When that level would take it on its own lean lane
        (:meth:`TorchComm.takes_lean_calls`: usable, no hooks, no call checking, asked on
        every call since a user may register hooks on a level) and its backend runs the
        reduction natively for the dtype, this calls the level's backend directly, with
        this communicator's default ``timeout``: the level's lane would check again what
        this communicator's lane has checked. Anything else goes to :meth:`all_reduce`.
        An engine failure propagates to this communicator's lane, which classifies it and
        marks this communicator failed, as a failure inside the level would.

        None with a single host, a global level on another device than host memory, or
        ``hier::flat_max_bytes=0``.
        """
        glob = self.global_comm
        settings = self._settings
        if glob is None or settings.rule.flat_max_bytes <= 0 or settings.cross_device.type != "cpu":
            return {}
        engine = glob.get_backend_impl()
        engine_cls = type(engine)
        native = frozenset(
            (dtype, red)
            for dtype in engine_cls.supported_dtypes
            for red in engine_cls.supported_reduce_ops
        )
        direct, takes_lean = engine.all_reduce, glob.takes_lean_calls
        method = self._collectives.all_reduce
        choose = self.tuning.choose

        def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
            if (
                0 < tensor.nbytes
                and choose("all_reduce", tensor.nbytes, tensor.dtype).algorithm == "flat"
                and (tensor.dtype, op._type) in native
                and takes_lean()
            ):
                return direct(tensor, op, False, timeout=timeout)
            return method(tensor, op, False, timeout=timeout)

        return {"all_reduce": all_reduce}

    # -- point to point ---------------------------------------------------------------

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Same host: through the local level; another host: through the global level."""
        levels = self._ready
        h, j = levels.topology.locate(dst)
        if h == levels.topology.host:
            return done(levels.local.send(tensor, j, async_op, timeout=timeout), async_op)
        assert levels.global_comm is not None
        cross_device = self._settings.cross_device
        staged = tensor if tensor.device == cross_device else tensor.to(cross_device)
        work = levels.global_comm.send(staged, dst, async_op, timeout=timeout)
        return done(work, async_op)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Same host: through the local level; another host: through the global level."""
        levels = self._ready
        h, j = levels.topology.locate(src)
        if h == levels.topology.host:
            return done(levels.local.recv(tensor, j, async_op, timeout=timeout), async_op)
        assert levels.global_comm is not None
        cross_device = self._settings.cross_device
        if tensor.device == cross_device:
            return done(levels.global_comm.recv(tensor, src, async_op, timeout=timeout), async_op)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device=cross_device)
        work = levels.global_comm.recv(host, src, True, timeout=timeout)

        def copy_back() -> None:
            tensor.copy_(host)

        chained = then(work, copy_back)
        if async_op:
            return chained
        chained.wait()
        return None

    # -- collectives: run by the part ``collectives`` -----------------------------------

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """In two levels, with the algorithm the tuning picks: ``flat``,
        ``recursive_doubling``, ``levels`` or ``pipelined`` (see
        :meth:`~torchcomms_hier.collectives.HierCollectives.all_reduce`)."""
        return self._collectives.all_reduce(tensor, op, async_op, timeout=timeout)

    def quantized_all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
        block_size: int = CODEC_BLOCK_SIZE,
        dtype: torch.dtype = torch.int8,
    ) -> Any:
        """torchcomms-quantized's ``quantized_all_reduce``: exact inside hosts, int8 between
        them. Completes before it returns."""
        return self._collectives.quantized_all_reduce(
            tensor, op, async_op, timeout=timeout, block_size=block_size, dtype=dtype
        )

    def quantized_reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
        block_size: int = CODEC_BLOCK_SIZE,
        dtype: torch.dtype = torch.int8,
    ) -> Any:
        """torchcomms-quantized's ``quantized_reduce_scatter``: exact inside hosts, int8
        between them. Completes before it returns."""
        return self._collectives.quantized_reduce_scatter(
            output, input, op, async_op, timeout=timeout, block_size=block_size, dtype=dtype
        )

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Root's rail (or the leaders) broadcasts across hosts, then every host locally."""
        return self._collectives.broadcast(tensor, root, async_op, timeout=timeout)

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Every host reduces locally to its carrier, the carriers reduce to the root's host."""
        return self._collectives.reduce(tensor, root, op, async_op, timeout=timeout)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Across hosts on the rails (or the leaders), then inside every host."""
        return self._collectives.all_gather_single(output, input, async_op, timeout=timeout)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """As :meth:`all_gather_single`, each rank's share copied to its entry."""
        return self._collectives.all_gather(tensor_list, tensor, async_op, timeout=timeout)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Inside every host first, then across hosts on the rails (or the leaders)."""
        return self._collectives.reduce_scatter_single(output, input, op, async_op, timeout=timeout)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """:meth:`reduce_scatter_single` over the concatenated inputs."""
        return self._collectives.reduce_scatter(output, input_list, op, async_op, timeout=timeout)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Local barrier, a barrier of the hosts' leaders, local barrier."""
        return self._collectives.barrier(async_op, timeout=timeout)
