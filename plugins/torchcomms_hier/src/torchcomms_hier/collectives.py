"""The collectives of :class:`~torchcomms_hier.HierBackend`, each in two levels: steps
inside every host on its local level, one share per host across hosts.

:class:`HierCollectives` is a part the backend holds: it receives the levels, the
settings, rank, size and the tuning's ``choose`` when the backend creates its levels, and
the backend's collective methods call it.

all_reduce picks its algorithm through the communicator's tuning (by default
:func:`~torchcomms_hier.algorithms.choose_all_reduce`); with the hint ``global_codec``
(see ``codec``) all_reduce and reduce_scatter send quantized data between hosts only.
``quantized_all_reduce`` and ``quantized_reduce_scatter`` (the collectives of
torchcomms-quantized, when installed) run here natively and take the same path.

May import: torch, ``torchcomms_core.plugin`` and this package's ``algorithms``, ``codec``,
``base``, ``pipeline`` and ``topology``; never ``backend``.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import Choice, CommInputError, RedOpType, ReduceOp

from .algorithms import recursive_doubling_all_reduce
from .base import HierLevels, HierSettings, done
from .codec import CODEC_BLOCK_SIZE, CODEC_INT8, codec_applies, codec_unavailable_reason
from .pipeline import pipelined_all_reduce, pipelined_gather

_SUM = ReduceOp.SUM


class HierCollectives:
    """The collectives of one hier communicator over its levels (see the module docstring)."""

    def __init__(
        self,
        levels: HierLevels,
        settings: HierSettings,
        rank: int,
        size: int,
        choose: Callable[[str, int, torch.dtype], Choice],
    ) -> None:
        """Run on ``levels`` with ``settings``, as rank ``rank`` of ``size``; ``choose`` is
        the communicator's ``tuning.choose``."""
        self._topo = levels.topology
        self._local = levels.local
        #: The cross-host level this rank joins: its rail, or the leaders (local rank 0).
        self._cross = levels.cross()
        self._global = levels.global_comm
        self._cross_device = settings.cross_device
        self._rule = settings.rule
        self._codec = settings.codec
        self._rank = rank
        self._size = size
        self._choose = choose

    # -- between the levels -----------------------------------------------------------

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
        cross = self._cross
        assert cross is not None
        order = self._perm(host_major=False, device=torch.device("cpu")).tolist()
        pipelined_gather(
            self._local, cross, flat, dests, order, self._topo.nhosts, self._cross_device, timeout
        )

    # -- all_reduce -------------------------------------------------------------------

    def _all_reduce_algorithm(self, nbytes: int, count: int, dtype: torch.dtype) -> str:
        """The all_reduce algorithm the communicator's tuning chooses (hier's size rule,
        :func:`~torchcomms_hier.algorithms.choose_all_reduce`, unless a tuner answers);
        ``pipelined`` where it cannot run (uneven hosts, one rank per host, fewer elements
        than local ranks) becomes ``levels``."""
        algorithm = self._choose("all_reduce", nbytes, dtype).algorithm
        topo = self._topo
        if algorithm == "pipelined" and not (
            topo.even and topo.local_size > 1 and count >= topo.local_size
        ):
            return "levels"
        return algorithm

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
    ) -> Any:
        """The algorithm :func:`~torchcomms_hier.algorithms.choose_all_reduce` picks:
        ``flat`` (one all_reduce on the global level), ``recursive_doubling`` between the
        hosts' leaders, ``levels`` (local reduce, leaders' all_reduce, local broadcast) or
        ``pipelined`` (local reduce_scatter, rail all_reduce, local all_gather). With
        ``global_codec=int8``, float SUM messages above ``hier::flat_max_bytes`` send
        quantized data between hosts (see ``codec``)."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return done(local.all_reduce(tensor, op, async_op, timeout=timeout), async_op)
        flat = tensor.view(-1)
        count = flat.numel()
        if count == 0:
            return None
        nbytes = count * flat.element_size()
        algorithm = self._all_reduce_algorithm(nbytes, count, tensor.dtype)
        if algorithm in ("levels", "pipelined") and codec_applies(self._codec, tensor.dtype, op):
            self._codec_all_reduce(tensor, algorithm, CODEC_BLOCK_SIZE, timeout)
            return None
        glob = self._global
        if algorithm == "flat" and glob is not None and tensor.device == self._cross_device:
            if timeout is None or timeout == glob.get_timeout():
                # The level's default timeout keeps the call on its lean lane.
                return done(glob.all_reduce(tensor, op, async_op), async_op)
            return done(glob.all_reduce(tensor, op, async_op, timeout=timeout), async_op)
        cross = self._cross
        if algorithm == "pipelined":
            assert cross is not None
            pipelined_all_reduce(local, cross, flat, op, self._cross_device, timeout)
            return None
        alone = topo.local_size == 1  # a host of one rank: nothing to reduce or spread
        if not alone:
            local.reduce(tensor, 0, op, timeout=timeout)
        if topo.local_rank == 0:
            assert cross is not None
            if algorithm == "recursive_doubling":
                self._staged(tensor, lambda t: recursive_doubling_all_reduce(cross, t, op, timeout))
            else:
                self._staged(tensor, lambda t: cross.all_reduce(t, op, timeout=timeout))
        if alone:
            return None
        return done(local.broadcast(tensor, 0, async_op, timeout=timeout), async_op)

    # -- the int8 hop between hosts ---------------------------------------------------

    def _codec_all_reduce(
        self, tensor: torch.Tensor, algorithm: str, block_size: int, timeout: timedelta | None
    ) -> None:
        """SUM of a float tensor: exact in float32 inside hosts, quantized between them.

        ``pipelined``: the pieces' parts start at block edges of the flattened tensor, so
        the blocks are those of a flat quantized_all_reduce. ``levels``: the leaders'
        quantized_all_reduce covers the whole tensor.
        """
        topo, local = self._topo, self._local
        cross = self._cross
        direct = tensor.dtype == torch.float32 and tensor.is_contiguous()
        work = tensor.view(-1) if direct else tensor.reshape(-1).to(torch.float32)

        def hop(t: torch.Tensor, async_op: bool) -> Any:
            assert cross is not None
            return cross.quantized_all_reduce(
                t, _SUM, async_op, timeout=timeout, block_size=block_size
            )

        if algorithm == "pipelined":
            assert cross is not None
            pipelined_all_reduce(
                local,
                cross,
                work,
                _SUM,
                self._cross_device,
                timeout,
                align=block_size,
                cross_all_reduce=lambda t: hop(t, True),
            )
        else:
            local.reduce(work, 0, _SUM, timeout=timeout)
            if topo.local_rank == 0:
                self._staged(work, lambda t: hop(t, False))
            local.broadcast(work, 0, timeout=timeout)
        if not direct:
            tensor.copy_(work.view(tensor.shape))

    def _codec_reduce_scatter(
        self,
        out: torch.Tensor,
        rows: torch.Tensor,
        block_size: int,
        timeout: timedelta | None,
    ) -> None:
        """SUM of float ``rows`` (``size x count``) into ``out`` (``count``): local
        reduce_scatter in float32, quantized reduce_scatter between hosts.

        Even hosts: the rail reduce_scatters what the host reduced for its ranks. Uneven:
        the leaders reduce_scatter, per host, as many chunks as the largest host holds,
        each padded to whole blocks (so each rank's chunk starts a block), and scatter
        them locally.
        """
        topo, local = self._topo, self._local
        cross = self._cross
        count = out.numel()
        rows32 = rows.to(torch.float32)
        result = out if out.dtype == torch.float32 else torch.empty(count, dtype=torch.float32)
        result = result.to(out.device)

        def hop(dst: torch.Tensor, src: torch.Tensor) -> None:
            assert cross is not None
            cross.quantized_reduce_scatter(
                dst, src.to(dst.device), _SUM, timeout=timeout, block_size=block_size
            )

        if topo.even:
            grouped = rows32.index_select(0, self._perm(host_major=False, device=rows.device))
            mid = torch.empty(topo.nhosts * count, dtype=torch.float32, device=out.device)
            local.reduce_scatter_single(mid, grouped.view(-1), _SUM, timeout=timeout)
            self._staged(result, lambda t: hop(t, mid), read=False)
        else:
            cols = -(-count // block_size) * block_size
            widest = max(len(members) for members in topo.hosts)
            padded = torch.zeros(
                (topo.nhosts, widest, cols), dtype=torch.float32, device=rows.device
            )
            for h, members in enumerate(topo.hosts):
                for j, r in enumerate(members):
                    padded[h, j, :count] = rows32[r]
            local.reduce(padded, 0, _SUM, timeout=timeout)
            mine = torch.empty((widest, cols), dtype=torch.float32, device=out.device)
            if topo.local_rank == 0:
                self._staged(mine, lambda t: hop(t.view(-1), padded.view(-1)), read=False)
            chunks = list(mine[: topo.local_size, :count]) if topo.local_rank == 0 else []
            local.scatter(result, [c.contiguous() for c in chunks], 0, timeout=timeout)
        if result is not out:
            out.copy_(result.view(out.shape))

    def _check_codec_call(self, name: str) -> None:
        """A quantized collective on a communicator whose codec is not int8 runs int8 anyway
        (it names its type); its levels must offer it."""
        reason = codec_unavailable_reason(CODEC_INT8)
        if reason is not None:
            raise CommInputError(f"hier {name}: {reason}")

    def quantized_all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        block_size: int = CODEC_BLOCK_SIZE,
        dtype: torch.dtype = torch.int8,
    ) -> Any:
        """torchcomms-quantized's ``quantized_all_reduce`` on hier: exact inside hosts,
        int8 between them (the ``global_codec=int8`` path, whatever the hint), so its
        bound is :func:`~torchcomms_hier.codec.global_codec_error_bound`. Small messages
        (up to ``hier::flat_max_bytes``) stay exact. Completes before it returns."""
        self._check_codec_call("quantized_all_reduce")
        topo = self._topo
        if tensor.numel() == 0:
            return None
        flat = tensor.view(-1)
        count = flat.numel()
        nbytes = count * flat.element_size()
        algorithm = self._all_reduce_algorithm(nbytes, count, tensor.dtype)
        if topo.nhosts == 1 or algorithm in ("flat", "recursive_doubling"):
            self.all_reduce(tensor, _SUM, False, timeout=timeout)
        else:
            self._codec_all_reduce(tensor, algorithm, block_size, timeout)
        if op.type is RedOpType.AVG:
            tensor.div_(torch.tensor(float(self._size), dtype=tensor.dtype))
        return None

    def quantized_reduce_scatter(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        block_size: int = CODEC_BLOCK_SIZE,
        dtype: torch.dtype = torch.int8,
    ) -> Any:
        """torchcomms-quantized's ``quantized_reduce_scatter`` on hier: exact inside hosts,
        int8 between them (the ``global_codec=int8`` path), with the bound of
        :func:`~torchcomms_hier.codec.global_codec_reduce_scatter_error_bound`. Completes
        before it returns."""
        self._check_codec_call("quantized_reduce_scatter")
        count = output.numel()
        if count == 0:
            return None
        if self._topo.nhosts == 1:
            self._local.reduce_scatter_single(output, input, _SUM, timeout=timeout)
        else:
            rows = input.reshape(self._size, count)
            self._codec_reduce_scatter(output.view(-1), rows, block_size, timeout)
        if op.type is RedOpType.AVG:
            output.div_(torch.tensor(float(self._size), dtype=output.dtype))
        return None

    # -- the other collectives --------------------------------------------------------

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
    ) -> Any:
        """Root's rail (or the leaders) broadcasts across hosts, then every host locally."""
        topo, local = self._topo, self._local
        root_host, root_local = topo.locate(root)
        if topo.nhosts == 1:
            return done(local.broadcast(tensor, root_local, async_op, timeout=timeout), async_op)
        carrier = self._cross_index(root_local)
        on_root_host = topo.host == root_host
        if carrier != root_local and on_root_host:
            local.broadcast(tensor, root_local, timeout=timeout)  # to the host's leader first
        if topo.local_rank == carrier:
            cross = self._cross
            assert cross is not None
            self._staged(
                tensor,
                lambda t: cross.broadcast(t, root_host, timeout=timeout),
                read=on_root_host,
            )
        if carrier != root_local and on_root_host:
            return None
        return done(local.broadcast(tensor, carrier, async_op, timeout=timeout), async_op)

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
    ) -> Any:
        """Every host reduces locally to its carrier, the carriers reduce to the root's host."""
        topo, local = self._topo, self._local
        root_host, root_local = topo.locate(root)
        if topo.nhosts == 1:
            return done(local.reduce(tensor, root_local, op, async_op, timeout=timeout), async_op)
        work = tensor if self._rank == root else tensor.clone()
        carrier = self._cross_index(root_local)
        local.reduce(work, carrier, op, timeout=timeout)
        if topo.local_rank == carrier:
            cross = self._cross
            assert cross is not None
            self._staged(work, lambda t: cross.reduce(t, root_host, op, timeout=timeout))
        if carrier != root_local and topo.host == root_host:
            if topo.local_rank == carrier:
                local.send(work, root_local, timeout=timeout)
            elif self._rank == root:
                return done(local.recv(tensor, carrier, async_op, timeout=timeout), async_op)
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
        cross = self._cross
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
    ) -> Any:
        """Two-level gather (see :meth:`_gather_rows`), rows then put in rank order."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return done(local.all_gather_single(output, input, async_op, timeout=timeout), async_op)
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
    ) -> Any:
        """Two-level gather (see :meth:`_gather_rows`), each row copied to its rank's entry."""
        if self._topo.nhosts == 1:
            return done(
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
    ) -> Any:
        """Even hosts: local reduce_scatter of the blocks grouped by rail, then rail
        reduce_scatter. Uneven: local reduce, leaders reduce_scatter_v, local scatter.
        With ``global_codec=int8``, float SUM inputs above ``hier::flat_max_bytes`` cross
        between hosts quantized (see ``_codec_reduce_scatter``)."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return done(
                local.reduce_scatter_single(output, input, op, async_op, timeout=timeout), async_op
            )
        out = output.view(-1)
        count = out.numel()
        if count == 0:
            return None  # every rank holds nothing: nothing to reduce
        rows = input.reshape(self._size, count)
        if (
            codec_applies(self._codec, input.dtype, op)
            and input.numel() * input.element_size() > self._rule.flat_max_bytes
        ):
            self._codec_reduce_scatter(out, rows, CODEC_BLOCK_SIZE, timeout)
            return None
        cross = self._cross
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
        return done(local.scatter(out, chunks, 0, async_op, timeout=timeout), async_op)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
    ) -> Any:
        """:meth:`reduce_scatter_single` over the concatenated inputs."""
        joined = torch.cat([t.reshape(-1) for t in input_list])
        return self.reduce_scatter_single(output, joined, op, async_op, timeout=timeout)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
    ) -> Any:
        """Local barrier, a barrier of the hosts' leaders, local barrier."""
        topo, local = self._topo, self._local
        if topo.nhosts == 1:
            return done(local.barrier(async_op, timeout=timeout), async_op)
        local.barrier(timeout=timeout)
        if topo.local_rank == 0:
            cross = self._cross
            assert cross is not None
            cross.barrier(timeout=timeout)
        return done(local.barrier(async_op, timeout=timeout), async_op)
