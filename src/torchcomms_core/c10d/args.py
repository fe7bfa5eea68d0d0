"""c10d's arguments as the communicator takes them, and c10d's rules for the coalesced ops.

``torch.distributed`` calls a process group with c10d option objects (``AllreduceOptions``
and friends, whose timeout reads -1 ms when unset), c10d reduce ops and tensor lists; the
bridge turns them into a ``TorchComm`` call's arguments here. The coalesced ops check their
inputs as c10d's engines do, in the words of the engine the communicator runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C import _distributed_c10d as _c10d

from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.operations.reduce_op import ReduceOp, coerce_reduce_op

#: c10d's class names of the engines it has, by backend name: the prefix of its messages.
_ENGINE_CLASSES = {
    "gloo": "ProcessGroupGloo",
    "nccl": "ProcessGroupNCCL",
    "mpi": "ProcessGroupMPI",
    "ucc": "ProcessGroupUCC",
    "xccl": "ProcessGroupXCCL",
}


def engine_label(backend_name: str, on_engine: bool) -> str:
    """Who speaks in an error: c10d's engine class when the communicator runs on one
    (``ProcessGroupGloo``, so callers that match gloo's words match ours), else the
    torchcomms backend."""
    if on_engine and backend_name in _ENGINE_CLASSES:
        return _ENGINE_CLASSES[backend_name]
    return f"torchcomms {backend_name} backend"


def timeout_of(opts: Any) -> timedelta | None:
    """The timeout a c10d options object carries, or ``None`` when it is unset (-1 ms)."""
    if opts is None:
        return None
    timeout = opts if isinstance(opts, timedelta) else getattr(opts, "timeout", None)
    if isinstance(timeout, timedelta) and timeout > timedelta(0):
        return timeout
    return None


def is_async(opts: Any) -> bool:
    """Whether c10d asked for an asynchronous call (``opts.asyncOp``; true when unsaid)."""
    return bool(getattr(opts, "asyncOp", True))


def reduce_op_of(opts: Any) -> ReduceOp:
    """Our ``ReduceOp`` for c10d options, a c10d ``ReduceOp``/``RedOpType`` or ours."""
    op = getattr(opts, "reduceOp", opts)
    if op is None:
        return ReduceOp.SUM
    kind = getattr(op, "op", op)
    if getattr(kind, "name", None) == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise CommInputError(
                "ReduceOp.PREMUL_SUM needs a factor; build it with "
                "torch.distributed._make_nccl_premul_sum(factor)"
            )
        return ReduceOp.PREMUL_SUM(factor)
    return coerce_reduce_op(op, "reduceOp")


_C10D_REDUCE_OP = _c10d.ReduceOp
_PREMUL_SUM = _c10d.ReduceOp.RedOpType.PREMUL_SUM  # type: ignore[attr-defined]


def is_premul_sum(opts: Any) -> bool:
    """Whether c10d options ask for PREMUL_SUM (which c10d's CPU engines cannot run)."""
    op = getattr(opts, "reduceOp", None)
    if op is None:
        return False
    if type(op) is _C10D_REDUCE_OP:
        # Runs on every reduction the bridge hands its engine: c10d's own comparison
        # costs a quarter of reading the enum's name.
        return bool(op == _PREMUL_SUM)
    return getattr(getattr(op, "op", op), "name", None) == "PREMUL_SUM"


def root_of(opts: Any, name: str = "rootRank") -> int:
    """The root rank of a rooted call (an options object or a bare rank)."""
    if isinstance(opts, int):
        return opts
    return int(getattr(opts, name, 0))


def tensor_list(tensors: Any, where: str) -> list[torch.Tensor]:
    """c10d's tensor list (one tensor also accepted)."""
    if isinstance(tensors, torch.Tensor):
        return [tensors]
    if not isinstance(tensors, (list, tuple)):
        raise CommTypeError(
            f"{where}: expected a tensor or a list of tensors, got {type(tensors).__name__}"
        )
    return list(tensors)


def one_tensor(tensors: Any, where: str) -> torch.Tensor:
    """The one tensor of a list that c10d fills with exactly one per process."""
    items = tensor_list(tensors, where)
    if len(items) != 1:
        raise CommInputError(f"{where}: expected exactly one tensor per process, got {len(items)}")
    return items[0]


def same_length(where: str, outs: Sequence[Any], ins: Sequence[Any]) -> None:
    """One output per input."""
    if len(outs) != len(ins):
        raise CommInputError(
            f"{where}: {len(outs)} outputs for {len(ins)} inputs; pass one output per input"
        )


def index_by_dtype(tensors: list[torch.Tensor]) -> list[list[int]]:
    """Positions of the tensors grouped by dtype, in first-seen order."""
    groups: dict[torch.dtype, list[int]] = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return list(groups.values())


def check_coalesced(label: str, where: str, tensors: list[torch.Tensor]) -> None:
    """c10d's rules for coalesced tensors: at least one, one dtype, one layout, dense."""
    if not tensors:
        raise RuntimeError(f"{label}::{where}: requires non-empty tensor list")
    first = tensors[0]
    for t in tensors[1:]:
        if t.dtype != first.dtype:
            raise RuntimeError(
                f"{label}::{where}: tensors must all have the same "
                f"type (got {first.dtype} and {t.dtype})"
            )
        if t.layout != first.layout:
            raise RuntimeError(
                f"{label}::{where}: tensors must all have the same "
                f"layout (got {first.layout} and {t.layout})"
            )
    if first.layout != torch.strided:
        raise RuntimeError(
            f"{label}::{where}: unsupported layout {first.layout}; "
            f"only dense tensors can be coalesced"
        )


def check_gather_coalesced(
    label: str, output_lists: Any, ins: list[torch.Tensor], size: int
) -> None:
    """c10d's rules for ``allgather_coalesced``: outputs ``[rank][input]`` like the inputs."""
    where = f"{label}::allgather_coalesced"
    if not ins:
        raise RuntimeError(f"{where}: requires non-empty input list")
    if len(output_lists) != size:
        raise RuntimeError(
            f"{where}: output list should be size {size} (one list per "
            f"rank), got {len(output_lists)}"
        )
    dtype = ins[0].dtype
    for outs in output_lists:
        if len(outs) != len(ins):
            raise RuntimeError(
                f"{where}: invalid output size: (expected length {len(ins)}, got {len(outs)})"
            )
        for i, (out, t) in enumerate(zip(outs, ins, strict=True)):
            if out.shape != t.shape:
                raise RuntimeError(
                    f"{where}: invalid size of output tensor at index {i} "
                    f"(expected length {list(t.shape)}, got {list(out.shape)})"
                )
            if out.dtype != dtype:
                raise RuntimeError(
                    f"{where}: invalid tensor type at index {i} (expected {dtype}, got {out.dtype})"
                )
    if any(t.layout != torch.strided for t in ins):
        raise RuntimeError(f"{where}: only dense tensors are supported")


def scatter_columns(gathered: torch.Tensor, outs: list[torch.Tensor]) -> Callable[[], None]:
    """Copy column blocks of a ``[size, total]`` gather into each ``[size * numel]`` output."""

    def step() -> None:
        offset = 0
        rows = gathered.shape[0]
        for out in outs:
            n = out.numel() // rows
            out.copy_(gathered[:, offset : offset + n].reshape(out.shape))
            offset += n

    return step


def chain(steps: list[Callable[[], None]]) -> Callable[[], None] | None:
    """One step running ``steps`` in order (``None`` for none)."""
    if not steps:
        return None
    if len(steps) == 1:
        return steps[0]

    def run() -> None:
        for step in steps:
            step()

    return run


def check_sizes(
    what: str,
    idx: list[int],
    big: tuple[str, list[torch.Tensor]],
    small: tuple[str, list[torch.Tensor]],
    n: int,
) -> None:
    """Each tensor ``i`` (in ``idx``) of ``big`` must hold ``n`` times the elements of
    ``small``'s; ``what`` is the operation named in the error."""
    (big_name, bigs), (small_name, smalls) = big, small
    for i in idx:
        if bigs[i].numel() != smalls[i].numel() * n:
            raise CommInputError(
                f"{what}: {big_name} {i} has {bigs[i].numel()} elements but must have "
                f"{small_name} numel * size = {smalls[i].numel()} * {n}"
            )
