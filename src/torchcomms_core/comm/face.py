# Generated from operations/table.py by scripts/gen_face.py: do not edit, rerun it.
"""``Face``: the communicator's operations, one method per row of the operation table.

Each method takes the row's parameters, then ``async_op``, ``hints`` and ``timeout``, and
returns a ``TorchWork``. A plain synchronous call of a row marked ``lean`` is first offered
to the lean lane (``comm.lean``), which a communicator without hooks or call checking
builds once per change of state; every other call takes the one route: ``_guard`` (state,
timeout, hints), the row's form in ``comm.forms`` (checks and staging), then ``_issue``
(hooks, the call of the backend entry the method names, the work). ``TorchComm``
(``comm.operations``) derives from ``Face`` and adds what is not an operation of the table.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from torchcomms_core.comm import forms
from torchcomms_core.comm.base import CommBase
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.reduce_op import ReduceOp

__all__ = ["Face"]


class Face(CommBase):
    """The operations of the operation table (``operations.table.OPS``) as methods."""

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Send ``tensor`` to rank ``dst``; the peer posts a matching :meth:`recv`."""
        call = self._guard("send", timeout, hints)
        bargs, values = forms.to_peer(self, call, tensor, dst)
        return self._issue(call, bargs, async_op, values, self._backend.send)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Receive into ``tensor`` from rank ``src`` (same element count and dtype as sent)."""
        call = self._guard("recv", timeout, hints)
        bargs, values = forms.from_peer(self, call, tensor, src)
        return self._issue(call, bargs, async_op, values, self._backend.recv)

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Copy rank ``root``'s ``tensor`` into ``tensor`` on every rank."""
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.broadcast(tensor, root)
            if work is not None:
                return work
        call = self._guard("broadcast", timeout, hints)
        bargs, values = forms.from_root(self, call, tensor, root)
        return self._issue(call, bargs, async_op, values, self._backend.broadcast)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Reduce ``tensor`` over every rank with ``op``; each rank gets the result in place.

        ``op`` is a :class:`ReduceOp`; AVG and PREMUL_SUM need a floating-point tensor and bitwise
        ops an integer or bool one (:class:`CommInputError` otherwise).
        """
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.all_reduce(tensor, op)
            if work is not None:
                return work
        call = self._guard("all_reduce", timeout, hints)
        bargs, values = forms.reduce_in_place(self, call, tensor, op)
        return self._issue(call, bargs, async_op, values, self._backend.all_reduce)

    def reduce(
        self,
        tensor: torch.Tensor,
        root: int,
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Reduce ``tensor`` over every rank with ``op`` into ``tensor`` on rank ``root``.

        Other ranks' tensors are left unchanged. ``op`` as for :meth:`all_reduce`.
        """
        call = self._guard("reduce", timeout, hints)
        bargs, values = forms.reduce_to_root(self, call, tensor, root, op)
        return self._issue(call, bargs, async_op, values, self._backend.reduce)

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``tensor`` into ``tensor_list`` (one same-sized entry per rank)."""
        call = self._guard("all_gather", timeout, hints)
        bargs, values = forms.gather_lists(self, call, tensor_list, tensor)
        return self._issue(call, bargs, async_op, values, self._backend.all_gather)

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """:meth:`all_gather` where ranks contribute tensors of different sizes.

        ``tensor_list[r]`` is sized for rank ``r``'s ``tensor``.
        """
        call = self._guard("all_gather_v", timeout, hints)
        bargs, values = forms.gather_lists(self, call, tensor_list, tensor)
        return self._issue(call, bargs, async_op, values, self._backend.all_gather_v)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``input`` into ``output`` (size x input's elements, rank order)."""
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.all_gather_single(output, input)
            if work is not None:
                return work
        call = self._guard("all_gather_single", timeout, hints)
        bargs, values = forms.gather_one(self, call, output, input)
        return self._issue(call, bargs, async_op, values, self._backend.all_gather_single)

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Reduce ``input_list[r]`` over every rank with ``op`` into rank ``r``'s ``output``."""
        call = self._guard("reduce_scatter", timeout, hints)
        bargs, values = forms.reduce_lists(self, call, output, input_list, op)
        return self._issue(call, bargs, async_op, values, self._backend.reduce_scatter)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """:meth:`reduce_scatter` with per-rank block sizes (``input_list[r]`` fits rank r)."""
        call = self._guard("reduce_scatter_v", timeout, hints)
        bargs, values = forms.reduce_lists(self, call, output, input_list, op)
        return self._issue(call, bargs, async_op, values, self._backend.reduce_scatter_v)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """:meth:`reduce_scatter` from one ``input`` of size x output's elements (rank order)."""
        call = self._guard("reduce_scatter_single", timeout, hints)
        bargs, values = forms.reduce_one(self, call, output, input, op)
        return self._issue(call, bargs, async_op, values, self._backend.reduce_scatter_single)

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Split ``input`` along dim 0 into size equal blocks; block r goes to rank r.

        ``output`` receives rank r's block at position r. Raises :class:`CommInputError` when dim 0
        is not divisible by the size (use :meth:`all_to_all_v_single`).
        """
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.all_to_all_single(output, input)
            if work is not None:
                return work
        call = self._guard("all_to_all_single", timeout, hints)
        bargs, values = forms.exchange_even(self, call, output, input)
        return self._issue(call, bargs, async_op, values, self._backend.all_to_all_single)

    def all_to_all_v_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Sequence[int],
        input_split_sizes: Sequence[int],
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """:meth:`all_to_all_single` with explicit block sizes (rows of dim 0 per rank).

        An empty list splits evenly; sizes must sum to the tensor's dim 0.
        """
        call = self._guard("all_to_all_v_single", timeout, hints)
        bargs, values = forms.exchange_split(
            self, call, output, input, output_split_sizes, input_split_sizes
        )
        return self._issue(call, bargs, async_op, values, self._backend.all_to_all_v_single)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Send ``input_tensor_list[r]`` to rank r; get its block in ``output_tensor_list[r]``.

        Blocks may differ in size between ranks; all share one dtype.
        """
        call = self._guard("all_to_all", timeout, hints)
        bargs, values = forms.exchange_lists(self, call, output_tensor_list, input_tensor_list)
        return self._issue(call, bargs, async_op, values, self._backend.all_to_all)

    def barrier(
        self,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Complete once every rank has called ``barrier``."""
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.barrier()
            if work is not None:
                return work
        call = self._guard("barrier", timeout, hints)
        bargs, values = forms.no_tensors(self, call)
        return self._issue(call, bargs, async_op, values, self._backend.barrier)

    def scatter(
        self,
        output_tensor: torch.Tensor,
        input_tensor_list: list[torch.Tensor],
        root: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Send root's ``input_tensor_list[r]`` to rank r's ``output_tensor``.

        Only ``root`` reads ``input_tensor_list`` (others may pass ``[]``).
        """
        call = self._guard("scatter", timeout, hints)
        bargs, values = forms.scatter_from_root(self, call, output_tensor, input_tensor_list, root)
        return self._issue(call, bargs, async_op, values, self._backend.scatter)

    def gather(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor: torch.Tensor,
        root: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``input_tensor`` into root's ``output_tensor_list``.

        Only ``root`` writes ``output_tensor_list`` (others may pass ``[]``).
        """
        call = self._guard("gather", timeout, hints)
        bargs, values = forms.gather_lists_to_root(
            self, call, output_tensor_list, input_tensor, root
        )
        return self._issue(call, bargs, async_op, values, self._backend.gather)

    def gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        root: int,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``input`` into root's ``output`` (size x input's elements)."""
        call = self._guard("gather_single", timeout, hints)
        bargs, values = forms.gather_one_to_root(self, call, output, input, root)
        return self._issue(call, bargs, async_op, values, self._backend.gather_single)
