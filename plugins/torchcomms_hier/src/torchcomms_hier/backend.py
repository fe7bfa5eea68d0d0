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

from .algorithms import ALGORITHMS, FLAT_MAX_BYTES_DEFAULT, RS_MIN_BYTES_DEFAULT
from .pipeline import PIECE_BYTES, PIPELINE_MAX_PIECES, pipelined_all_reduce, pipelined_gather
from .topology import Topology, exchange, resolve_settings

__all__ = [
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


def _done(work: Any, async_op: bool) -> Any:
    """What an operation returns: the level's work when asynchronous, else ``None``."""
    return work if async_op else None


class HierBackend(StoredRankAndSize, TorchCommBackend):
    """A hierarchical backend: each host on its own local backend, hosts joined by a global one.

    ``comm.get_backend_impl()`` is this object; :meth:`levels` returns its communicators.
    """

    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = HIER_DTYPES
    #: all_reduce: flat, reduce_scatter or leaders (``algorithms``, #45).
    algorithms = ALGORITHMS
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        "local_backend",
        "global_backend",
        "host_id",
        "hier::rs_min_bytes",
        "hier::flat_max_bytes",
        "hier::lazy_global",
    )

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
        self._rs_min_bytes = RS_MIN_BYTES_DEFAULT
        self._flat_max_bytes = FLAT_MAX_BYTES_DEFAULT

    # -- lifecycle --------------------------------------------------------------------

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        """Exchange every rank's host and backends, then create the levels."""
        self._rank, self._size = options.rank, options.size
        hints = dict(options.hints)
        self._rs_min_bytes = int_hint(hints, "hier::rs_min_bytes", RS_MIN_BYTES_DEFAULT)
        self._flat_max_bytes = int_hint(hints, "hier::flat_max_bytes", FLAT_MAX_BYTES_DEFAULT)
        lazy_global = bool_hint(hints, "hier::lazy_global", True)
        settings = resolve_settings(hints, device)
        topo = exchange(
            options.store, self._rank, self._size, options.timeout, settings, device, name
        )
        self.topology = topo
        global_cls = get_backend_class(topo.global_backend)
        # Cross-host levels run where the global backend can; otherwise through host memory.
        self._cross_device = device if device.type in global_cls.devices else torch.device("cpu")
        created: list[TorchComm] = []
        try:
            h, j = topo.host, topo.local_rank
            self.local = self._level(
                topo.local_backends[h], device, f"{name}.local{h}", j, topo.local_size, {}
            )
            created.append(self.local)
            if topo.nhosts > 1:
                if topo.even:
                    self.rail = self._level(
                        topo.global_backend, self._cross_device, f"{name}.rail{j}", h, topo.nhosts
                    )
                    created.append(self.rail)
                elif j == 0:
                    self.leaders = self._level(
                        topo.global_backend, self._cross_device, f"{name}.leaders", h, topo.nhosts
                    )
                    created.append(self.leaders)
                # Every pair of ranks connected on first use, when the global backend
                # can (gloo's ``lazy``): cross-host send/recv between two ranks connects
                # those two only, a small all_reduce the pairs its algorithm uses. A lazy
                # gloo pair blocks a receive whose sender never comes for the engine's
                # whole timeout (the level's, this communicator's default), not the call's.
                lazy = lazy_global and LAZY_HINT in (global_cls.hint_keys or ())
                self.global_comm = self._level(
                    topo.global_backend,
                    self._cross_device,
                    f"{name}.global",
                    self._rank,
                    self._size,
                    {LAZY_HINT: "true"} if lazy else None,
                )
                created.append(self.global_comm)
        except BaseException:
            for comm in reversed(created):
                comm.abort()
            raise

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
        topo = self._topo
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
        local = self._local.split(
            [topo.locate(ranks[c])[1] for c in mine] if member else [],
            f"{name}.local{index.get(topo.host, 0)}",
        )
        rail = leaders = global_comm = None
        if self.global_comm is not None and child_topo.nhosts > 1:
            h_c, j_c = child_topo.locate(child_topo.rank) if member else (-1, -1)
            if child_topo.even:
                group = [ranks[child_topo.rank_of(h, j_c)] for h in range(child_topo.nhosts)]
                rail = self.global_comm.split(group if member else [], f"{name}.rail{j_c}")
            else:
                group = [ranks[m[0]] for m in child_topo.hosts]
                chosen = member and j_c == 0
                leaders = self.global_comm.split(group if chosen else [], f"{name}.leaders")
            global_comm = self.global_comm.split(list(ranks) if member else [], f"{name}.global")
        if not member:
            return None
        child = HierBackend()
        child._bind(self.device, name, options)
        child._rank, child._size = options.rank, options.size
        child.topology = child_topo
        child._cross_device = self._cross_device
        child._rs_min_bytes = self._rs_min_bytes
        child._flat_max_bytes = self._flat_max_bytes
        child.local, child.rail, child.leaders, child.global_comm = (
            local,
            rail,
            leaders,
            global_comm,
        )
        return child

    def levels(self) -> dict[str, TorchComm]:
        """This rank's level communicators by role (``local``, ``rail``, ``leaders``,
        ``global``), those it belongs to only."""
        found = {
            "local": self.local,
            "rail": self.rail,
            "leaders": self.leaders,
            "global": self.global_comm,
        }
        return {role: comm for role, comm in found.items() if comm is not None}

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

    # -- helpers ----------------------------------------------------------------------

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

    # -- the core's lean lane ---------------------------------------------------------

    def lean_calls(
        self, timeout: timedelta, hints: dict[str, str]
    ) -> dict[str, Callable[..., Any]]:
        """A blocking ``all_reduce`` for the core's lean lane: small messages straight into
        the global level's backend.

        An all_reduce of at most ``hier::flat_max_bytes`` is one all_reduce on the global
        level (see :meth:`all_reduce`). When that level would take it on its own lean lane
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
        flat_max = self._flat_max_bytes
        if glob is None or flat_max <= 0 or self._cross_device.type != "cpu":
            return {}
        engine = glob.get_backend_impl()
        engine_cls = type(engine)
        native = frozenset(
            (dtype, red)
            for dtype in engine_cls.supported_dtypes
            for red in engine_cls.supported_reduce_ops
        )
        direct, takes_lean, method = engine.all_reduce, glob.takes_lean_calls, self.all_reduce
        choose = self.tuning.choose

        def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
            if (
                0 < tensor.nbytes
                and choose("all_reduce", tensor.nbytes, tensor.dtype).algorithm == "flat"
                and (tensor.dtype, op._type) in native
                and takes_lean()
            ):
                return direct(tensor, op, False, timeout=timeout)
            return method(tensor, op, False, timeout=timeout, hints=hints)

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
        h, j = self._topo.locate(dst)
        if h == self._topo.host:
            return _done(self._local.send(tensor, j, async_op, timeout=timeout), async_op)
        assert self.global_comm is not None
        staged = tensor if tensor.device == self._cross_device else tensor.to(self._cross_device)
        work = self.global_comm.send(staged, dst, async_op, timeout=timeout)
        return _done(work, async_op)

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
        h, j = self._topo.locate(src)
        if h == self._topo.host:
            return _done(self._local.recv(tensor, j, async_op, timeout=timeout), async_op)
        assert self.global_comm is not None
        if tensor.device == self._cross_device:
            return _done(self.global_comm.recv(tensor, src, async_op, timeout=timeout), async_op)
        host = torch.empty(tensor.shape, dtype=tensor.dtype, device=self._cross_device)
        work = self.global_comm.recv(host, src, True, timeout=timeout)

        def copy_back() -> None:
            tensor.copy_(host)

        chained = then(work, copy_back)
        if async_op:
            return chained
        chained.wait()
        return None

    # -- collectives ------------------------------------------------------------------

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Small messages: one all_reduce on the global level. Even hosts, large messages:
        local reduce_scatter, rail all_reduce, local all_gather. Otherwise: local reduce,
        leader all_reduce, local broadcast."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return _done(local.all_reduce(tensor, op, async_op, timeout=timeout), async_op)
        flat = tensor.view(-1)
        count = flat.numel()
        if count == 0:
            return None
        algorithm = self.tuning.choose("all_reduce", tensor.nbytes, tensor.dtype).algorithm
        if (
            algorithm == "flat"
            and self.global_comm is not None
            and tensor.device == self._cross_device
        ):
            glob = self.global_comm
            if timeout is None or timeout == glob.get_timeout():
                # The level's default timeout keeps the call on its lean lane.
                return _done(glob.all_reduce(tensor, op, async_op), async_op)
            return _done(glob.all_reduce(tensor, op, async_op, timeout=timeout), async_op)
        lsize = topo.local_size
        cross = self._cross()
        if topo.even and count >= lsize and algorithm == "reduce_scatter" and lsize > 1:
            assert cross is not None
            pipelined_all_reduce(local, cross, flat, op, self._cross_device, timeout)
            return None
        local.reduce(tensor, 0, op, timeout=timeout)
        if topo.local_rank == 0:
            assert cross is not None
            self._staged(tensor, lambda t: cross.all_reduce(t, op, timeout=timeout))
        return _done(local.broadcast(tensor, 0, async_op, timeout=timeout), async_op)

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
        topo, local = self._topo, self._local
        root_host, root_local = topo.locate(root)
        if topo.nhosts == 1:
            return _done(local.broadcast(tensor, root_local, async_op, timeout=timeout), async_op)
        carrier = self._cross_index(root_local)
        on_root_host = topo.host == root_host
        if carrier != root_local and on_root_host:
            local.broadcast(tensor, root_local, timeout=timeout)  # to the host's leader first
        if topo.local_rank == carrier:
            cross = self._cross()
            assert cross is not None
            self._staged(
                tensor,
                lambda t: cross.broadcast(t, root_host, timeout=timeout),
                read=on_root_host,
            )
        if carrier != root_local and on_root_host:
            return None
        return _done(local.broadcast(tensor, carrier, async_op, timeout=timeout), async_op)

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
        topo, local = self._topo, self._local
        root_host, root_local = topo.locate(root)
        if topo.nhosts == 1:
            return _done(local.reduce(tensor, root_local, op, async_op, timeout=timeout), async_op)
        work = tensor if self._rank == root else tensor.clone()
        carrier = self._cross_index(root_local)
        local.reduce(work, carrier, op, timeout=timeout)
        if topo.local_rank == carrier:
            cross = self._cross()
            assert cross is not None
            self._staged(work, lambda t: cross.reduce(t, root_host, op, timeout=timeout))
        if carrier != root_local and topo.host == root_host:
            if topo.local_rank == carrier:
                local.send(work, root_local, timeout=timeout)
            elif self._rank == root:
                return _done(local.recv(tensor, carrier, async_op, timeout=timeout), async_op)
        return None

    def _gather_rows(
        self, flat: torch.Tensor, timeout: timedelta | None
    ) -> tuple[torch.Tensor, list[int]]:
        """Every rank's ``flat`` as the rows of one tensor, and the rank of each row.

        Even hosts: rail all_gather (one share per rank crosses), then local all_gather.
        Uneven: local all_gather, leaders all_gather_v, local broadcast.
        """
        topo, local = self._topo, self._local
        count = flat.numel()
        cross = self._cross()
        gathered = torch.empty(self._size * count, dtype=flat.dtype, device=flat.device)
        if topo.even:
            assert cross is not None
            rail_buf = torch.empty(topo.nhosts * count, dtype=flat.dtype, device=flat.device)
            self._staged(
                rail_buf,
                lambda t: cross.all_gather_single(t, flat.to(t.device), timeout=timeout),
                read=False,
            )
            local.all_gather_single(gathered, rail_buf, timeout=timeout)
        else:
            host_buf = torch.empty(topo.local_size * count, dtype=flat.dtype, device=flat.device)
            local.all_gather_single(host_buf, flat, timeout=timeout)
            if topo.local_rank == 0:
                assert cross is not None
                sizes = [len(members) * count for members in topo.hosts]

                def across(t: torch.Tensor) -> None:
                    cross.all_gather_v(
                        list(torch.split(t, sizes)), host_buf.to(t.device), timeout=timeout
                    )

                self._staged(gathered, across, read=False)
            local.broadcast(gathered, 0, timeout=timeout)
        order = self._perm(host_major=not topo.even, device=torch.device("cpu")).tolist()
        return gathered.view(self._size, count), order

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Two-level gather (see :meth:`_gather_rows`), rows then put in rank order."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return _done(
                local.all_gather_single(output, input, async_op, timeout=timeout), async_op
            )
        flat = input.reshape(-1)
        count = flat.numel()
        if count == 0:
            return None  # every rank contributes nothing
        if topo.even:
            self._pipelined_gather(flat, list(output.view(self._size, count)), timeout)
            return None
        gathered, order = self._gather_rows(flat, timeout)
        rows = output.view(self._size, count)
        if order == list(range(self._size)):
            rows.copy_(gathered)
        else:
            rows.index_copy_(0, torch.tensor(order, device=output.device), gathered)
        return None

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Two-level gather (see :meth:`_gather_rows`), each row copied to its rank's entry."""
        if self._topo.nhosts == 1:
            return _done(
                self._local.all_gather(tensor_list, tensor, async_op, timeout=timeout), async_op
            )
        if tensor.numel() == 0:
            return None
        if self._topo.even and all(t.is_contiguous() for t in tensor_list):
            self._pipelined_gather(tensor.reshape(-1), [t.view(-1) for t in tensor_list], timeout)
            return None
        gathered, order = self._gather_rows(tensor.reshape(-1), timeout)
        for row, r in zip(gathered, order, strict=True):
            tensor_list[r].copy_(row.view_as(tensor_list[r]))
        return None

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
        """Even hosts: local reduce_scatter of the blocks grouped by rail, then rail
        reduce_scatter. Uneven: local reduce, leaders reduce_scatter_v, local scatter."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return _done(
                local.reduce_scatter_single(output, input, op, async_op, timeout=timeout), async_op
            )
        out = output.view(-1)
        count = out.numel()
        if count == 0:
            return None  # every rank holds nothing: nothing to reduce
        rows = input.reshape(self._size, count)
        cross = self._cross()
        if topo.even:
            assert cross is not None
            grouped = rows.index_select(0, self._perm(host_major=False, device=input.device))
            mid = torch.empty(topo.nhosts * count, dtype=out.dtype, device=out.device)
            local.reduce_scatter_single(mid, grouped.view(-1), op, timeout=timeout)
            self._staged(
                out,
                lambda t: cross.reduce_scatter_single(t, mid.to(t.device), op, timeout=timeout),
                read=False,
            )
            return None
        grouped = rows.index_select(0, self._perm(host_major=True, device=input.device))
        local.reduce(grouped, 0, op, timeout=timeout)
        mine = torch.empty(topo.local_size * count, dtype=out.dtype, device=out.device)
        if topo.local_rank == 0:
            assert cross is not None
            sizes = [len(members) * count for members in topo.hosts]
            flat = grouped.view(-1)

            def across(t: torch.Tensor) -> None:
                cross.reduce_scatter_v(
                    t, list(torch.split(flat.to(t.device), sizes)), op, timeout=timeout
                )

            self._staged(mine, across, read=False)
        chunks = list(torch.split(mine, count)) if topo.local_rank == 0 else []
        return _done(local.scatter(out, chunks, 0, async_op, timeout=timeout), async_op)

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
        joined = torch.cat([t.reshape(-1) for t in input_list])
        return self.reduce_scatter_single(output, joined, op, async_op, timeout=timeout)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Local barrier, a barrier of the hosts' leaders, local barrier."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return _done(local.barrier(async_op, timeout=timeout), async_op)
        local.barrier(timeout=timeout)
        if topo.local_rank == 0:
            cross = self._cross()
            assert cross is not None
            cross.barrier(timeout=timeout)
        return _done(local.barrier(async_op, timeout=timeout), async_op)
