"""distwrap's collectives, with ``torch.distributed``'s signatures.

On a torchcomms group each call runs on the communicator of its tensors' device type;
otherwise it is ``torch.distributed``'s own call with the same arguments. ``async_op=True``
returns a c10d ``Work``, else ``None``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from torchcomms_core.c10d.work import CommWork
from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.reduce_op import ReduceOp as CommsReduceOp
from torchcomms_core.operations.reduce_op import coerce_reduce_op
from torchcomms_core.pytorch.distwrap.routing import group_rank_of, on_group
from torchcomms_core.pytorch.distwrap.world import TorchCommsGroup, resolve


def to_comms_op(op: Any, what: str) -> CommsReduceOp:
    """A torchcomms ``ReduceOp`` from c10d's (``dist.ReduceOp.SUM``) or ours."""
    if isinstance(op, CommsReduceOp):
        return op
    name = getattr(op, "name", None) or getattr(getattr(op, "op", None), "name", None)
    if name == "PREMUL_SUM":
        raise CommInputError(
            f"{what}: this PREMUL_SUM was made by torch.distributed and carries a factor "
            f"torchcomms cannot read; make it with torchcomms.distwrap._make_nccl_premul_sum"
            f"(factor) after init_process_group(..., use_torchcomms=True)"
        )
    return coerce_reduce_op(op, "op")


def done(work: TorchWork, async_op: bool, result: Any) -> CommWork | None:
    """``torch.distributed``'s return: a ``Work`` for ``async_op``, else ``None`` (the call
    was synchronous and has completed)."""
    if not async_op:
        return None
    return CommWork([work], result)


@on_group(dist.all_reduce)
def all_reduce(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce ``tensor`` across the group in place (``torch.distributed.all_reduce``)."""
    comm = pg.comm_for(tensor.device, "all_reduce")
    work = comm.all_reduce(tensor, to_comms_op(op, "all_reduce"), async_op)
    return done(work, async_op, [tensor])


@on_group(dist.broadcast)
def broadcast(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """Copy the source's ``tensor`` to every rank (``torch.distributed.broadcast``)."""
    root = group_rank_of(pg, src, group_src, "broadcast", "src")
    work = pg.comm_for(tensor.device, "broadcast").broadcast(tensor, root, async_op)
    return done(work, async_op, [tensor])


@on_group(dist.reduce)
def reduce(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    dst: int | None = None,
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Reduce into the destination's ``tensor`` (``torch.distributed.reduce``)."""
    root = group_rank_of(pg, dst, group_dst, "reduce", "dst")
    comm = pg.comm_for(tensor.device, "reduce")
    work = comm.reduce(tensor, root, to_comms_op(op, "reduce"), async_op)
    return done(work, async_op, [tensor])


@on_group(dist.all_gather)
def all_gather(
    pg: TorchCommsGroup,
    tensor_list: list[torch.Tensor],
    tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Gather every rank's ``tensor`` into ``tensor_list`` (``torch.distributed.all_gather``)."""
    work = pg.comm_for(tensor.device, "all_gather").all_gather(tensor_list, tensor, async_op)
    return done(work, async_op, tensor_list)


@on_group(dist.all_gather_into_tensor)
def all_gather_into_tensor(
    pg: TorchCommsGroup,
    output_tensor: torch.Tensor,
    input_tensor: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Gather every rank's input, concatenated or stacked along dim 0, into ``output_tensor``."""
    comm = pg.comm_for(input_tensor.device, "all_gather_into_tensor")
    work = comm.all_gather_single(output_tensor, input_tensor, async_op)
    return done(work, async_op, [output_tensor])


@on_group(dist.reduce_scatter)
def reduce_scatter(
    pg: TorchCommsGroup,
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Reduce block ``k`` of every rank's ``input_list`` into rank ``k``'s ``output``."""
    comm = pg.comm_for(output.device, "reduce_scatter")
    work = comm.reduce_scatter(output, input_list, to_comms_op(op, "reduce_scatter"), async_op)
    return done(work, async_op, [output])


@on_group(dist.reduce_scatter_tensor)
def reduce_scatter_tensor(
    pg: TorchCommsGroup,
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any = dist.ReduceOp.SUM,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """``reduce_scatter`` with the blocks as consecutive parts of one ``input`` tensor."""
    comm = pg.comm_for(output.device, "reduce_scatter_tensor")
    work = comm.reduce_scatter_single(
        output, input, to_comms_op(op, "reduce_scatter_tensor"), async_op
    )
    return done(work, async_op, [output])


@on_group(dist.all_to_all)
def all_to_all(
    pg: TorchCommsGroup,
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """Send ``input_tensor_list[k]`` to rank ``k``; receive rank ``k``'s into slot ``k``."""
    device = (input_tensor_list or output_tensor_list or [torch.empty(0)])[0].device
    comm = pg.comm_for(device, "all_to_all")
    work = comm.all_to_all(output_tensor_list, input_tensor_list, async_op)
    return done(work, async_op, output_tensor_list)


@on_group(dist.all_to_all_single)
def all_to_all_single(
    pg: TorchCommsGroup,
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: list[int] | None = None,
    input_split_sizes: list[int] | None = None,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """``all_to_all`` over dim-0 blocks of one tensor (even blocks, or the split sizes)."""
    comm = pg.comm_for(input.device, "all_to_all_single")
    if not output_split_sizes and not input_split_sizes:
        work = comm.all_to_all_single(output, input, async_op)
    else:
        n = comm.get_size()
        outs = list(output_split_sizes or _even(output, n, "output"))
        ins = list(input_split_sizes or _even(input, n, "input"))
        work = comm.all_to_all_v_single(output, input, outs, ins, async_op)
    return done(work, async_op, [output])


def _even(t: torch.Tensor, n: int, which: str) -> list[int]:
    rows = t.shape[0] if t.dim() else t.numel()
    if rows % n:
        raise CommInputError(
            f"all_to_all_single: {which} has {rows} rows, which do not split evenly among "
            f"{n} ranks; pass {which}_split_sizes"
        )
    return [rows // n] * n


@on_group(dist.scatter)
def scatter(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    scatter_list: list[torch.Tensor] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """Give rank ``k`` the source's ``scatter_list[k]`` (``torch.distributed.scatter``)."""
    root = group_rank_of(pg, src, group_src, "scatter", "src")
    comm = pg.comm_for(tensor.device, "scatter")
    inputs = list(scatter_list or []) if comm.get_rank() == root else []
    work = comm.scatter(tensor, inputs, root, async_op)
    return done(work, async_op, [tensor])


@on_group(dist.gather)
def gather(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    gather_list: list[torch.Tensor] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """Collect every rank's ``tensor`` into the destination's ``gather_list``."""
    root = group_rank_of(pg, dst, group_dst, "gather", "dst")
    comm = pg.comm_for(tensor.device, "gather")
    outputs = list(gather_list or []) if comm.get_rank() == root else []
    work = comm.gather(outputs, tensor, root, async_op)
    return done(work, async_op, outputs)


@on_group(dist.barrier)
def barrier(
    pg: TorchCommsGroup,
    group: Any = None,
    async_op: bool = False,
    device_ids: list[int] | None = None,
) -> Any:
    """Wait until every rank of the group reached the barrier."""
    comm = pg.comm_for("cuda", "barrier") if device_ids else pg.default_comm
    work = comm.barrier(True)
    return done(work, async_op, [])


def reduce_scatter_quantized(
    output: torch.Tensor,
    input: torch.Tensor,
    op: Any,
    seed: torch.Tensor,
    group: Any = None,
    async_op: bool = False,
) -> Any:
    """The reference's reduce-scatter with bfloat16 stochastic-rounded transport.

    Runs ``comm.reduce_scatter_quantized``: the backend's own kernel where it has one,
    else torchcomms-quantized's portable one (any backend that sends bfloat16). As in the
    reference, the work is returned whatever ``async_op`` (already waited for when false).
    """
    pg = resolve(group, "reduce_scatter_quantized")
    if pg is None:
        raise CommInputError(
            "reduce_scatter_quantized needs init_process_group(..., use_torchcomms=True): "
            "it runs on a torchcomms communicator"
        )
    comm = pg.comm_for(output.device, "reduce_scatter_quantized")
    method = getattr(comm, "reduce_scatter_quantized", None)
    if method is None:
        raise CommInputError(
            f"reduce_scatter_quantized: communicator {comm.get_name()!r} has no "
            f"reduce_scatter_quantized; install torchcomms-quantized (pip install "
            f"torchcomms-quantized), which adds it to every backend, or use "
            f"reduce_scatter_tensor"
        )
    work = method(output, input, to_comms_op(op, "reduce_scatter_quantized"), seed, async_op)
    if work is not None and not async_op:
        work.wait()
    return work
