"""What is particular to each operation: the checks of its arguments and their staging.

The communicator's methods (``comm.face``) are written from the operation table; each one
guards the call (``CommBase._guard``), hands its arguments to the *form* its row names,
and issues what the form returns (``CommBase._issue``). A form checks the arguments (a bad
one raises before anything is sent), stages what the backend cannot take as given
(contiguous stand-ins for results, AVG and PREMUL_SUM lowered for a backend without them)
and returns ``(backend arguments, hook values)``: what the backend's method receives
before ``async_op``, and the arguments as hooks and the cross-rank check see them.

Operations that differ only in whether blocks may differ between ranks share a form; the
row's ``uniform`` tells them apart.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchcomms_core.comm.base import CommBase
from torchcomms_core.comm.call import Call, _in
from torchcomms_core.foundation.errors import CommInputError
from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.operations.table import BY_NAME
from torchcomms_core.operations.validation import split_sizes

#: ``(backend arguments, hook values)``.
Prepared = tuple[tuple[Any, ...], tuple[Any, ...]]


def _uneven_rank(comm: CommBase, op: str) -> int | None:
    """The rank whose block alone must fit, for an uneven operation (``None``: all do)."""
    return None if BY_NAME[op].uniform else comm._rank


def _lowered(
    comm: CommBase,
    call: Call,
    red: ReduceOp,
    out: torch.Tensor | None,
    inputs: list[torch.Tensor],
) -> tuple[ReduceOp, list[torch.Tensor]]:
    """Lower ``red`` for reductions into ``out`` from ``inputs`` (which stay unchanged)."""
    bop, factor = call.lower(red, comm._native_ops, out, comm._size)
    return bop, inputs if factor is None else [t * factor for t in inputs]


def to_peer(comm: CommBase, call: Call, tensor: torch.Tensor, dst: int) -> Prepared:
    comm._check.tensor(call.op, "tensor", tensor)
    dst = comm._check.peer(call.op, "dst", dst, allow_self=comm._self_p2p)
    return (_in(tensor), dst), (tensor, dst)


def from_peer(comm: CommBase, call: Call, tensor: torch.Tensor, src: int) -> Prepared:
    comm._check.tensor(call.op, "tensor", tensor)
    src = comm._check.peer(call.op, "src", src, allow_self=comm._self_p2p)
    return (call.out(tensor), src), (tensor, src)


def from_root(comm: CommBase, call: Call, tensor: torch.Tensor, root: int) -> Prepared:
    comm._check.tensor(call.op, "tensor", tensor)
    root = comm._check.peer(call.op, "root", root)
    return (call.out(tensor, keep=True), root), (tensor, root)


def reduce_in_place(comm: CommBase, call: Call, tensor: torch.Tensor, op: ReduceOp) -> Prepared:
    comm._check.tensor(call.op, "tensor", tensor)
    red = comm._check.reduce_op(call.op, op, tensor.dtype)
    if red._type in comm._native_ops and tensor.is_contiguous():  # the common case, lean
        return (tensor, red), (tensor, red)
    buf, bop = call.reduce_in_place(tensor, red, comm._native_ops, comm._size)
    return (buf, bop), (tensor, red)


def reduce_to_root(
    comm: CommBase, call: Call, tensor: torch.Tensor, root: int, op: ReduceOp
) -> Prepared:
    comm._check.tensor(call.op, "tensor", tensor)
    root = comm._check.peer(call.op, "root", root)
    red = comm._check.reduce_op(call.op, op, tensor.dtype)
    if comm._rank == root:
        buf, bop = call.reduce_in_place(tensor, red, comm._native_ops, comm._size)
    else:
        bop, (buf,) = _lowered(comm, call, red, None, [_in(tensor)])
    return (buf, root, bop), (tensor, root, red)


def gather_lists(
    comm: CommBase, call: Call, tensor_list: list[torch.Tensor], tensor: torch.Tensor
) -> Prepared:
    name = call.op
    comm._check.tensor(name, "tensor", tensor)
    only = _uneven_rank(comm, name)
    outs = comm._check.blocks(name, "tensor_list", tensor_list, "tensor", tensor, only)
    return ([call.out(t) for t in outs], _in(tensor)), (tensor_list, tensor)


def gather_one(comm: CommBase, call: Call, output: torch.Tensor, input: torch.Tensor) -> Prepared:
    comm._check.pair(call.op, output, input)
    comm._check.times_size(call.op, "output", output, "input", input)
    return (call.out(output), _in(input)), (output, input)


def reduce_lists(
    comm: CommBase,
    call: Call,
    output: torch.Tensor,
    input_list: list[torch.Tensor],
    op: ReduceOp,
) -> Prepared:
    name = call.op
    comm._check.tensor(name, "output", output)
    only = _uneven_rank(comm, name)
    ins = comm._check.blocks(name, "input_list", input_list, "output", output, only)
    red = comm._check.reduce_op(name, op, output.dtype)
    out = call.out(output)
    bop, bins = _lowered(comm, call, red, out, [_in(t) for t in ins])
    return (out, bins, bop), (output, input_list, red)


def reduce_one(
    comm: CommBase, call: Call, output: torch.Tensor, input: torch.Tensor, op: ReduceOp
) -> Prepared:
    name = call.op
    comm._check.pair(name, output, input)
    comm._check.times_size(name, "input", input, "output", output)
    red = comm._check.reduce_op(name, op, output.dtype)
    out = call.out(output)
    bop, (bin_,) = _lowered(comm, call, red, out, [_in(input)])
    return (out, bin_, bop), (output, input, red)


def exchange_lists(
    comm: CommBase,
    call: Call,
    output_tensor_list: list[torch.Tensor],
    input_tensor_list: list[torch.Tensor],
) -> Prepared:
    name, c, me, n = call.op, comm._check, comm._rank, comm._size
    outs = c.tensor_list(name, "output_tensor_list", output_tensor_list, n)
    ins = c.tensor_list(name, "input_tensor_list", input_tensor_list, n)
    for i in range(n):
        c.same_dtype(name, f"output_tensor_list[{i}]", outs[i], "input_tensor_list[0]", ins[0])
        c.same_dtype(name, f"input_tensor_list[{i}]", ins[i], "input_tensor_list[0]", ins[0])
    c.numel(
        name,
        f"output_tensor_list[{me}]",
        outs[me],
        ins[me].numel(),
        f"this rank sends input_tensor_list[{me}] to itself",
    )
    return (
        ([call.out(t) for t in outs], [_in(t) for t in ins]),
        (output_tensor_list, input_tensor_list),
    )


def exchange_even(
    comm: CommBase, call: Call, output: torch.Tensor, input: torch.Tensor
) -> Prepared:
    name = call.op
    comm._check.pair(name, output, input)
    comm._check.numel(name, "output", output, input.numel(), "the same as the input")
    rows = input.shape[0] if input.dim() else 1
    if rows % comm._size:
        raise CommInputError(
            f"{name}: input dim 0 ({rows}) must be divisible by the communicator "
            f"size {comm._size}; use all_to_all_v_single for uneven splits"
        )
    return (call.out(output), _in(input)), (output, input)


def exchange_split(
    comm: CommBase,
    call: Call,
    output: torch.Tensor,
    input: torch.Tensor,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
) -> Prepared:
    op = call.op
    comm._check.pair(op, output, input)
    if input.dim() == 0 or output.dim() == 0:
        raise CommInputError(f"{op}: input and output need at least one dimension to split")
    if output.shape[1:] != input.shape[1:]:
        raise CommInputError(
            f"{op}: output rows have shape {tuple(output.shape[1:])} but input rows have "
            f"{tuple(input.shape[1:])}; all dimensions but the first must match"
        )
    n, me = comm._size, comm._rank
    osz = split_sizes(op, "output_split_sizes", output_split_sizes, n, output.shape[0])
    isz = split_sizes(op, "input_split_sizes", input_split_sizes, n, input.shape[0])
    if osz[me] != isz[me]:
        raise CommInputError(
            f"{op}: output_split_sizes[{me}]={osz[me]} must equal input_split_sizes[{me}]="
            f"{isz[me]} (this rank's block to itself)"
        )
    return (call.out(output), _in(input), osz, isz), (output, input, list(osz), list(isz))


def no_tensors(comm: CommBase, call: Call) -> Prepared:
    return (), ()


def _root_blocks(
    comm: CommBase,
    call: Call,
    blocks_name: str,
    blocks: list[torch.Tensor],
    one_name: str,
    one: torch.Tensor,
    root: int,
    stage: Callable[[torch.Tensor], torch.Tensor],
) -> tuple[int, list[torch.Tensor]]:
    """``(root, the root's blocks staged)``: every rank checks its one tensor and the root,
    the root alone its blocks (the others may pass ``[]``)."""
    comm._check.tensor(call.op, one_name, one)
    root = comm._check.peer(call.op, "root", root)
    if comm._rank != root:
        return root, []
    return root, [stage(t) for t in comm._check.blocks(call.op, blocks_name, blocks, one_name, one)]


def scatter_from_root(
    comm: CommBase,
    call: Call,
    output_tensor: torch.Tensor,
    input_tensor_list: list[torch.Tensor],
    root: int,
) -> Prepared:
    root, bins = _root_blocks(
        comm,
        call,
        "input_tensor_list",
        input_tensor_list,
        "output_tensor",
        output_tensor,
        root,
        _in,
    )
    return (call.out(output_tensor), bins, root), (output_tensor, input_tensor_list, root)


def gather_lists_to_root(
    comm: CommBase,
    call: Call,
    output_tensor_list: list[torch.Tensor],
    input_tensor: torch.Tensor,
    root: int,
) -> Prepared:
    root, bouts = _root_blocks(
        comm,
        call,
        "output_tensor_list",
        output_tensor_list,
        "input_tensor",
        input_tensor,
        root,
        call.out,
    )
    return (bouts, _in(input_tensor), root), (output_tensor_list, input_tensor, root)


def gather_one_to_root(
    comm: CommBase, call: Call, output: torch.Tensor, input: torch.Tensor, root: int
) -> Prepared:
    name = call.op
    comm._check.tensor(name, "input", input)
    root = comm._check.peer(name, "root", root)
    out = output
    if comm._rank == root:
        comm._check.pair(name, output, input)
        comm._check.times_size(name, "output", output, "input", input)
        out = call.out(output)
    return (out, _in(input), root), (output, input, root)
