"""The portable defaults: every derivable operation, written against ``send`` and ``recv``.

:class:`PortableDefaults` is the base :class:`~torchcomms_core.spec.TorchCommBackend`
inherits its derivable operations from, so a backend that implements only the required
primitives already runs every collective. Each default states what the operation does and
("Default:") how it is built; arguments, return value and errors follow the contract
stated once on ``TorchCommBackend``. A backend overriding one makes it *native*
(:func:`~torchcomms_core.spec.method_support`). A backend may call a default from its own
override (``super().all_to_all(...)``) for the cases its engine cannot run.

The defaults favour correctness over speed: the reductions gather every contribution and
reduce in rank order, so results are bit-identical on every rank.

Imports: ``torch``, ``torchcomms_core.operations`` and ``spec.work``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.operations.table import forwarding
from torchcomms_core.spec.work import (
    MultiWork,
    flat_chunks,
    reduce_rows,
    settle,
    split_dim0,
    then,
)

#: One operation of a batch as a backend receives it: ``("send" | "recv", tensor, peer)``
#: (the user-facing ``P2POp`` unpacks to this).
BatchOp = tuple[str, torch.Tensor, int]


#: The defaults that only forward to another operation with the same arguments, nothing
#: moved or reduced on the way. Where a backend implements the target natively the
#: forwarding operation runs natively too, so ``method_support`` reports it ``"native"``
#: and a backend need not restate the forwarding to be listed so.
FORWARDING_DEFAULTS: dict[str, str] = forwarding()


class PortableDefaults:
    """The derivable operations' portable implementations, over ``send`` and ``recv``."""

    if TYPE_CHECKING:  # What the defaults build on; TorchCommBackend declares each of them.
        device: torch.device
        get_rank: Callable[[], int]
        get_size: Callable[[], int]
        send: Callable[..., Any]
        recv: Callable[..., Any]

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Issue every send and receive of ``ops`` before waiting for any of them.

        Default: each op as an asynchronous ``send``/``recv``, completed together
        (:class:`~torchcomms_core.spec.MultiWork`).
        """
        works = []
        for kind, tensor, peer in ops:
            method = self.send if kind == "send" else self.recv
            work = method(tensor, peer, True, timeout=timeout, hints=hints)
            if work is not None:
                works.append(work)
        return settle(MultiWork(works) if works else None, async_op)

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Copy ``root``'s ``tensor`` into ``tensor`` on every rank (one shape and dtype on all).

        Default: ``root`` sends to every peer and the others receive, in one :meth:`batch_op_issue`.
        """
        me, n = self.get_rank(), self.get_size()
        if me == root:
            ops = [("send", tensor, peer) for peer in range(n) if peer != me]
        else:
            ops = [("recv", tensor, root)]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``tensor`` into ``tensor_list[rank]`` everywhere; sizes may differ.

        Default: this rank copies its own entry and exchanges with every peer in one
        :meth:`batch_op_issue`.
        """
        me, n = self.get_rank(), self.get_size()
        tensor_list[me].copy_(tensor)
        ops: list[BatchOp] = []
        for peer in range(n):
            if peer != me:
                ops.append(("send", tensor, peer))
                ops.append(("recv", tensor_list[peer], peer))
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``tensor`` into ``tensor_list[rank]`` on every rank (equal shapes).

        Default: :meth:`all_gather_v`.
        """
        return self.all_gather_v(tensor_list, tensor, async_op, timeout=timeout, hints=hints)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``input`` into one tensor: rank ``r``'s in ``output``'s chunk ``r``.

        Default: :meth:`all_gather` into equal flat views of ``output`` (``flat_chunks``).
        """
        chunks = flat_chunks(output, self.get_size())
        return self.all_gather(chunks, input.view(-1), async_op, timeout=timeout, hints=hints)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``input_tensor_list[p]`` to rank ``p``; receive its into ``output_tensor_list[p]``.

        Default: this rank's own entry is copied locally, every peer is exchanged with in one
        :meth:`batch_op_issue` (blocks may differ in size).
        """
        me, n = self.get_rank(), self.get_size()
        output_tensor_list[me].copy_(input_tensor_list[me])
        ops: list[BatchOp] = []
        for peer in range(n):
            if peer != me:
                ops.append(("send", input_tensor_list[peer], peer))
                ops.append(("recv", output_tensor_list[peer], peer))
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def all_to_all_v_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """All-to-all over dim 0 of one tensor each way, with per-rank block sizes (rows).

        Block ``p`` of ``input`` goes to rank ``p``; rank ``p``'s block for this rank lands
        in block ``p`` of ``output``. Empty split sizes mean ``get_size()`` equal blocks.

        Default: :meth:`all_to_all` over the blocks (``split_dim0``).
        """
        n = self.get_size()
        outs = split_dim0(output, output_split_sizes, n)
        ins = split_dim0(input, input_split_sizes, n)
        return self.all_to_all(outs, ins, async_op, timeout=timeout, hints=hints)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """All-to-all over dim 0 in equal blocks: block ``p`` of ``input`` goes to rank ``p``.

        Default: :meth:`all_to_all_v_single` with empty split sizes.
        """
        return self.all_to_all_v_single(
            output, input, [], [], async_op, timeout=timeout, hints=hints
        )

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``tensor`` over every rank with ``op``; every rank's ``tensor`` holds the result.

        Default: every rank gathers every contribution (:meth:`all_gather_single` into a
        temporary of ``get_size()`` times ``tensor``'s size) and reduces the rows in rank
        order, so the result is bit-identical on every rank.
        """
        n = self.get_size()
        flat = tensor.view(-1)
        gathered = torch.empty((n, flat.numel()), dtype=tensor.dtype, device=tensor.device)
        work = self.all_gather_single(gathered, flat, async_op, timeout=timeout, hints=hints)

        def reduce_locally() -> None:
            flat.copy_(reduce_rows(gathered, op.type))

        return then(work, reduce_locally)

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
        """Reduce ``tensor`` over every rank with ``op`` into ``root``'s ``tensor``.

        Other ranks' tensors are left unchanged.

        Default: :meth:`all_reduce`, on a copy of ``tensor`` on ranks other than ``root``.
        """
        target = tensor if self.get_rank() == root else tensor.clone()
        return self.all_reduce(target, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Reduce ``input_list[r]`` over every rank into rank ``r``'s ``output``; sizes may differ.

        Default: an :meth:`all_to_all` delivers every rank's block for this rank, which is then
        reduced locally in rank order.
        """
        n = self.get_size()
        flat_out = output.view(-1)
        received = torch.empty((n, flat_out.numel()), dtype=output.dtype, device=output.device)
        work = self.all_to_all(
            list(received.unbind(0)),
            [t.view(-1) for t in input_list],
            async_op,
            timeout=timeout,
            hints=hints,
        )

        def reduce_locally() -> None:
            flat_out.copy_(reduce_rows(received, op.type))

        return then(work, reduce_locally)

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
        """Reduce ``input_list[r]`` over every rank into rank ``r``'s ``output`` (equal sizes).

        Default: :meth:`reduce_scatter_v`.
        """
        return self.reduce_scatter_v(output, input_list, op, async_op, timeout=timeout, hints=hints)

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
        """Reduce chunk ``r`` of ``input`` over every rank into rank ``r``'s ``output``.

        Default: :meth:`reduce_scatter_v` over equal flat views of ``input`` (``flat_chunks``).
        """
        n = self.get_size()
        blocks = flat_chunks(input, n)
        return self.reduce_scatter_v(output, blocks, op, async_op, timeout=timeout, hints=hints)

    def scatter(
        self,
        output_tensor: torch.Tensor,
        input_tensor_list: list[torch.Tensor],
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Send ``root``'s ``input_tensor_list[r]`` to rank ``r``'s ``output_tensor``.

        ``input_tensor_list`` is ignored on ranks other than ``root``.

        Default: ``root`` copies its own entry and sends the others in one :meth:`batch_op_issue`.
        """
        me, n = self.get_rank(), self.get_size()
        if me != root:
            return self.batch_op_issue(
                [("recv", output_tensor, root)], async_op, timeout=timeout, hints=hints
            )
        output_tensor.copy_(input_tensor_list[me])
        ops = [("send", input_tensor_list[p], p) for p in range(n) if p != me]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def gather(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Collect every rank's ``input_tensor`` into ``root``'s ``output_tensor_list``.

        ``output_tensor_list`` is ignored on ranks other than ``root``.

        Default: ranks other than ``root`` send, ``root`` receives in one :meth:`batch_op_issue`.
        """
        me, n = self.get_rank(), self.get_size()
        if me != root:
            return self.batch_op_issue(
                [("send", input_tensor, root)], async_op, timeout=timeout, hints=hints
            )
        output_tensor_list[me].copy_(input_tensor)
        ops = [("recv", output_tensor_list[p], p) for p in range(n) if p != me]
        return self.batch_op_issue(ops, async_op, timeout=timeout, hints=hints)

    def gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Gather every rank's ``input`` into ``root``'s ``output``: rank ``r``'s in chunk ``r``.

        Default: :meth:`gather` into equal flat views of ``output`` (``flat_chunks``).
        """
        chunks = flat_chunks(output, self.get_size()) if self.get_rank() == root else []
        return self.gather(chunks, input.view(-1), root, async_op, timeout=timeout, hints=hints)

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        """Return (or complete the work) once every rank has entered the barrier.

        Default: an :meth:`all_reduce` of a one-element tensor on the communicator's device.
        """
        token = torch.zeros(1, dtype=torch.float32, device=self.device)
        return self.all_reduce(token, ReduceOp.SUM, async_op, timeout=timeout, hints=hints)
