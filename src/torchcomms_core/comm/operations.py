"""``TorchComm``: the communicator users hold (``new_comm`` builds it, in ``_create``).

Each operation checks its arguments, stages what the backend cannot take as given, and
issues the call through ``CommBase`` (``comm.base``), which owns the state, the hooks and
the backend call.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import torch

from torchcomms_core.comm.base import CommBase
from torchcomms_core.comm.batch import BatchSendRecv
from torchcomms_core.comm.call import _in
from torchcomms_core.comm.collectives import make_method
from torchcomms_core.comm.handles import PersistentAllGather, owned
from torchcomms_core.comm.window import TorchCommWindow, create_window
from torchcomms_core.creation.join import join_or_finalize, members_key
from torchcomms_core.creation.names import check_name, claim_name, release_name
from torchcomms_core.foundation.errors import CommInputError, CommStateError, TorchCommError
from torchcomms_core.foundation.states import OK
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.operations.validation import check_hints, check_timeout, split_sizes
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.manager import PluginError, attach_collective_host, call_lifecycle
from torchcomms_core.plugin_host.tuners import agree_after_init, confirm_tuning, make_tuning

# all_reduce, broadcast and all_to_all_single open with the lean lane (``comm.lean``): a
# plain synchronous call that qualifies is checked and issued there.


class TorchComm(CommBase):
    """An eagerly initialised communicator over one backend and one device.

    Every operation takes ``async_op`` (return at once; wait on the returned work),
    ``hints`` (``dict[str, str]`` for the backend) and ``timeout`` (a ``timedelta`` or
    seconds; default :meth:`get_timeout`), and returns a :class:`TorchWork`. Every
    operation may raise :class:`CommStateError` (finalized, aborted or failed
    communicator) and, before anything is sent, :class:`CommTypeError` or
    :class:`CommInputError` for a bad argument. Engine failures raise
    :class:`CommTimeoutError` or :class:`CommOperationError` from the call (synchronous)
    or from ``wait()`` (asynchronous) and mark the communicator failed.
    """

    # -- plugin collectives ------------------------------------------------------------

    @classmethod
    def _add_collective(cls, coll: Collective) -> None:
        """Install a plugin collective as a method (the plugin host calls this)."""
        if hasattr(cls, coll.name):
            raise PluginError(
                f"{coll.provider} registers collective {coll.name!r}, which is "
                f"already a built-in TorchComm method; pick another name"
            )
        setattr(cls, coll.name, make_method(coll))

    @classmethod
    def _remove_collective(cls, name: str) -> None:
        if getattr(cls.__dict__.get(name), "_plugin_collective", False):
            delattr(cls, name)

    # -- point to point --------------------------------------------------------------

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
        self._check.tensor("send", "tensor", tensor)
        dst = self._check.peer("send", "dst", dst, allow_self=self._self_p2p)
        return self._issue(call, (_in(tensor), dst), async_op, (tensor, dst))

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
        self._check.tensor("recv", "tensor", tensor)
        src = self._check.peer("recv", "src", src, allow_self=self._self_p2p)
        return self._issue(call, (call.out(tensor), src), async_op, (tensor, src))

    def batch_op_create(self) -> BatchSendRecv:
        """Start a batch of sends and receives, issued together by its ``issue()``."""
        self._check_usable("batch_op_create")
        return BatchSendRecv(self)

    # -- collectives -----------------------------------------------------------------

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
        self._check.tensor("broadcast", "tensor", tensor)
        root = self._check.peer("broadcast", "root", root)
        return self._issue(call, (call.out(tensor, keep=True), root), async_op, (tensor, root))

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Reduce ``tensor`` over every rank with ``op``; each rank gets the result in place.

        ``op`` is a :class:`ReduceOp`; AVG and PREMUL_SUM need a floating-point tensor and
        bitwise ops an integer or bool one (:class:`CommInputError` otherwise).
        """
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.all_reduce(tensor, op)
            if work is not None:
                return work
        call = self._guard("all_reduce", timeout, hints)
        self._check.tensor("all_reduce", "tensor", tensor)
        red = self._check.reduce_op("all_reduce", op, tensor.dtype)
        if red._type in self._native_ops and tensor.is_contiguous():  # the common case, lean
            return self._issue(call, (tensor, red), async_op, (tensor, red))
        buf, bop = call.reduce_in_place(tensor, red, self._native_ops, self._size)
        return self._issue(call, (buf, bop), async_op, (tensor, red))

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
        self._check.tensor("reduce", "tensor", tensor)
        root = self._check.peer("reduce", "root", root)
        red = self._check.reduce_op("reduce", op, tensor.dtype)
        if self._rank == root:
            buf, bop = call.reduce_in_place(tensor, red, self._native_ops, self._size)
        else:
            bop, (buf,) = self._reduced(call, red, None, [_in(tensor)])
        return self._issue(call, (buf, root, bop), async_op, (tensor, root, red))

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``tensor`` into ``tensor_list`` (one same-sized entry per rank)."""
        return self._gather_lists("all_gather", tensor_list, tensor, async_op, hints, timeout)

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
        return self._gather_lists("all_gather_v", tensor_list, tensor, async_op, hints, timeout)

    def _gather_lists(
        self,
        name: str,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        hints: dict[str, str] | None,
        timeout: timedelta | None,
    ) -> TorchWork:
        call = self._guard(name, timeout, hints)
        self._check.tensor(name, "tensor", tensor)
        only = self._rank if name == "all_gather_v" else None  # _v: blocks may differ
        outs = self._check.blocks(name, "tensor_list", tensor_list, "tensor", tensor, only)
        return self._issue(
            call, ([call.out(t) for t in outs], _in(tensor)), async_op, (tensor_list, tensor)
        )

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
        self._check.pair("all_gather_single", output, input)
        self._check.times_size("all_gather_single", "output", output, "input", input)
        return self._issue(call, (call.out(output), _in(input)), async_op, (output, input))

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
        return self._reduce_scatter_lists(
            "reduce_scatter", output, input_list, op, async_op, hints, timeout
        )

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
        return self._reduce_scatter_lists(
            "reduce_scatter_v", output, input_list, op, async_op, hints, timeout
        )

    def _reduce_scatter_lists(
        self,
        name: str,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        hints: dict[str, str] | None,
        timeout: timedelta | None,
    ) -> TorchWork:
        call = self._guard(name, timeout, hints)
        self._check.tensor(name, "output", output)
        only = self._rank if name == "reduce_scatter_v" else None  # _v: blocks may differ
        ins = self._check.blocks(name, "input_list", input_list, "output", output, only)
        red = self._check.reduce_op(name, op, output.dtype)
        out = call.out(output)
        bop, bins = self._reduced(call, red, out, [_in(t) for t in ins])
        return self._issue(call, (out, bins, bop), async_op, (output, input_list, red))

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
        self._check.pair("reduce_scatter_single", output, input)
        self._check.times_size("reduce_scatter_single", "input", input, "output", output)
        red = self._check.reduce_op("reduce_scatter_single", op, output.dtype)
        out = call.out(output)
        bop, (bin_,) = self._reduced(call, red, out, [_in(input)])
        return self._issue(call, (out, bin_, bop), async_op, (output, input, red))

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
        c, me = self._check, self._rank
        outs = c.tensor_list("all_to_all", "output_tensor_list", output_tensor_list, self._size)
        ins = c.tensor_list("all_to_all", "input_tensor_list", input_tensor_list, self._size)
        for i in range(self._size):
            c.same_dtype(
                "all_to_all", f"output_tensor_list[{i}]", outs[i], "input_tensor_list[0]", ins[0]
            )
            c.same_dtype(
                "all_to_all", f"input_tensor_list[{i}]", ins[i], "input_tensor_list[0]", ins[0]
            )
        c.numel(
            "all_to_all",
            f"output_tensor_list[{me}]",
            outs[me],
            ins[me].numel(),
            f"this rank sends input_tensor_list[{me}] to itself",
        )
        return self._issue(
            call,
            ([call.out(t) for t in outs], [_in(t) for t in ins]),
            async_op,
            (output_tensor_list, input_tensor_list),
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Split ``input`` along dim 0 into size equal blocks; block r goes to rank r.

        ``output`` receives rank r's block at position r. Raises :class:`CommInputError` when
        dim 0 is not divisible by the size (use :meth:`all_to_all_v_single`).
        """
        lane = self._lane
        if lane is not None and not async_op and timeout is None and hints is None:
            work = lane.all_to_all_single(output, input)
            if work is not None:
                return work
        call = self._guard("all_to_all_single", timeout, hints)
        self._check.pair("all_to_all_single", output, input)
        self._check.numel(
            "all_to_all_single", "output", output, input.numel(), "the same as the input"
        )
        rows = input.shape[0] if input.dim() else 1
        if rows % self._size:
            raise CommInputError(
                f"all_to_all_single: input dim 0 ({rows}) must be divisible by the communicator "
                f"size {self._size}; use all_to_all_v_single for uneven splits"
            )
        return self._issue(call, (call.out(output), _in(input)), async_op, (output, input))

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
        op = "all_to_all_v_single"
        call = self._guard(op, timeout, hints)
        self._check.pair(op, output, input)
        if input.dim() == 0 or output.dim() == 0:
            raise CommInputError(f"{op}: input and output need at least one dimension to split")
        if output.shape[1:] != input.shape[1:]:
            raise CommInputError(
                f"{op}: output rows have shape {tuple(output.shape[1:])} but input rows have "
                f"{tuple(input.shape[1:])}; all dimensions but the first must match"
            )
        n, me = self._size, self._rank
        osz = split_sizes(op, "output_split_sizes", output_split_sizes, n, output.shape[0])
        isz = split_sizes(op, "input_split_sizes", input_split_sizes, n, input.shape[0])
        if osz[me] != isz[me]:
            raise CommInputError(
                f"{op}: output_split_sizes[{me}]={osz[me]} must equal input_split_sizes[{me}]="
                f"{isz[me]} (this rank's block to itself)"
            )
        return self._issue(
            call,
            (call.out(output), _in(input), osz, isz),
            async_op,
            (output, input, list(osz), list(isz)),
        )

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
        return self._issue(call, (), async_op, ())

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
        self._check.tensor("scatter", "output_tensor", output_tensor)
        root = self._check.peer("scatter", "root", root)
        bins: list[torch.Tensor] = []
        if self._rank == root:
            bins = [
                _in(t)
                for t in self._check.blocks(
                    "scatter",
                    "input_tensor_list",
                    input_tensor_list,
                    "output_tensor",
                    output_tensor,
                )
            ]
        return self._issue(
            call,
            (call.out(output_tensor), bins, root),
            async_op,
            (output_tensor, input_tensor_list, root),
        )

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
        self._check.tensor("gather", "input_tensor", input_tensor)
        root = self._check.peer("gather", "root", root)
        bouts: list[torch.Tensor] = []
        if self._rank == root:
            bouts = [
                call.out(t)
                for t in self._check.blocks(
                    "gather", "output_tensor_list", output_tensor_list, "input_tensor", input_tensor
                )
            ]
        return self._issue(
            call,
            (bouts, _in(input_tensor), root),
            async_op,
            (output_tensor_list, input_tensor, root),
        )

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
        self._check.tensor("gather_single", "input", input)
        root = self._check.peer("gather_single", "root", root)
        out = output
        if self._rank == root:
            self._check.pair("gather_single", output, input)
            self._check.times_size("gather_single", "output", output, "input", input)
            out = call.out(output)
        return self._issue(call, (out, _in(input), root), async_op, (output, input, root))

    # -- windows and persistent all-gather ---------------------------------------------

    def new_window(self, tensor: torch.Tensor | None = None) -> TorchCommWindow:
        """Create a one-sided window (collective); registers ``tensor`` at once if given.

        Raises :class:`CommStateError` when the backend has no windows
        (``method_support()["new_window"]``). See :class:`TorchCommWindow`.
        """
        if self._state is not OK:
            self._ensure_usable("new_window")
        return create_window(self, tensor)

    def all_gather_p_init(
        self,
        output: torch.Tensor,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> PersistentAllGather:
        """Bind ``output`` for repeated all-gathers; returns the handle ``exec`` takes."""
        self._guard("all_gather_p_init", timeout, hints)
        self._check.tensor("all_gather_p_init", "output", output)
        if output.numel() % self._size:
            raise CommInputError(
                f"all_gather_p_init: output has {output.numel()} elements, not "
                f"a multiple of the communicator size {self._size}"
            )
        return PersistentAllGather(self, output)

    def all_gather_p_exec(
        self,
        handle: PersistentAllGather,
        input: torch.Tensor,
        async_op: bool = False,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Gather every rank's ``input`` into the output bound by ``all_gather_p_init``."""
        output = owned(handle, self, "all_gather_p_exec").output
        if output is None:
            raise CommStateError("all_gather_p_exec: the handle was freed by all_gather_p_free")
        return self.all_gather_single(output, input, async_op, hints, timeout)

    def all_gather_p_free(self, handle: PersistentAllGather) -> None:
        """Release a handle from ``all_gather_p_init``; it cannot be executed again."""
        owned(handle, self, "all_gather_p_free").output = None

    # -- sub-communicators -----------------------------------------------------------

    def reconfigure(
        self,
        uuid: int | str,
        init_handles: list[str] | set[str],
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> TorchWork:
        """Bind the communicator to exactly the members ``init_handles`` names (fault tolerance).

        Rank is the caller's position in the list (sorted order for a set), size its length;
        ``uuid`` must be new for this communicator. Completed on return. Raises
        :class:`CommInputError` when members disagree and :class:`CommTimeoutError` when one
        never arrives. See docs/fault-tolerance.md.
        """
        from torchcomms_core.comm.reconfigure import (
            reconfigure,  # fault tolerance loads only when used
        )

        return reconfigure(self, uuid, init_handles, timeout, hints)

    def split(
        self,
        ranks: Sequence[int],
        name: str,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchComm | None:
        """Create a sub-communicator of ``ranks`` (parent ranks); non-members pass ``[]``.

        Members get a ``TorchComm`` whose ranks follow the sorted order of ``ranks``;
        non-members get ``None``. Every member must pass the same list and ``name``.
        """
        if self._state is not OK:
            self._ensure_usable("split")
        check_name(name, "split")
        members = self._check.split_ranks(ranks)
        hints = check_hints(hints, "split") if hints is not None else None
        timeout = check_timeout(timeout, "split") if timeout is not None else self._timeout
        hook_args = self._hooks_before("split", (list(ranks), name))
        from torch._C._distributed_c10d import PrefixStore  # torch.distributed loads on first use

        store = PrefixStore(f"split/{name}/{members_key(members)}", self._store)
        options = self._options.replace(
            name=name,
            store=store,
            timeout=timeout,
            hints={**self._hints, **(hints or {})},
            rank=members.index(self._rank) if members else -1,
            size=len(members),
            tuning=None,
        )
        if not members:
            # Backends with a collective native split need every parent rank to take part.
            if self._support["split"] == "native":
                self._backend.split([], name, options)
            self._hooks_after(hook_args)
            return None
        claim_name(self._store, f"split/{name}", self._rank, self._name)
        try:
            # The members agree on the child's tuner on its store, before its engine (#45).
            shared = getattr(self._backend.tuning, "shared", True)
            options.tuning = make_tuning(
                self._backend,
                self._backend_name,
                self._device,
                options,
                shared_store=shared,
                what=f"split: communicator {name!r} of {self._name!r}",
                claim_key=lambda r: f"names/split/{name}/{r}",
                claims=self._store,
                members=members,
            )
            child = self._backend.split(members, name, options)
            if child is None:
                raise TorchCommError(
                    f"split: backend {self.get_backend()!r} returned no "
                    f"communicator for members {members}"
                )
            if not child.init_waits_for_peers():
                join_or_finalize(
                    child,
                    store,
                    len(members),
                    options.timeout,
                    f"split: communicator {name!r} of {self._name!r}",
                    claim_key=lambda r: f"names/split/{name}/{r}",
                    claims=self._store,
                    members=members,
                )
            if shared:
                confirm_tuning(child.tuning)
            else:
                agree_after_init(child.tuning, child, self._backend_name, self._device)
        except BaseException:
            release_name(self._store, f"split/{name}", self._rank)
            raise
        comm = TorchComm(child, self._device, name, options, store, self._backend_name)
        self._hooks_after(hook_args)
        call_lifecycle("torchcomms_comm_created", comm=comm, parent=self)
        return comm


attach_collective_host(TorchComm._add_collective, TorchComm._remove_collective)
