"""The lean lane: which operations may skip the general path, and when. One table.

The general path (``CommBase._guard`` ... ``_issue``) checks every argument, stages what the
backend cannot take as given, runs hooks and wraps the backend's result. For a plain
synchronous call on a CPU communicator nothing of that would change the outcome, and its
cost is most of a small collective's time on a fast engine; such calls take the lane:
check the arguments inline, call the backend, return a completed work.

:data:`TABLE` says which operations have a lane and what each needs beyond the conditions
every lane call shares (:data:`COMMUNICATOR`, :data:`CALL`). :func:`build` makes one
communicator's lane from it; the communicator rebuilds it (``CommBase._relean``) whenever
its state, hooks, default timeout or hints change, and keeps ``None`` while any
:data:`COMMUNICATOR` condition fails. A call that does not qualify goes the general path,
which also raises the errors; the lane never raises an argument error of its own.

The c10d bridge has a lane of its own into the backend's engine, under the same
:data:`COMMUNICATOR` conditions (``TorchComm.takes_lean_calls``).

Backends may offer entry points for the lane (``TorchCommBackend.lean_calls``), called in
place of their methods; an operation without one takes the backend's method. Three of
the bundled backends do: mpi (``all_reduce``, ``broadcast``, ``all_to_all_single``; they
keep the MPI buffer specs of recent tensors: ``mpiexec -n 2 python
benchmarks/mpi_overhead.py`` measures a 1-element all_reduce at 5.9 us through mpi's entry
point against 7.4 us through its method, raw mpi4py 4.9 us), shm (``all_reduce``,
``broadcast``, ``barrier``, which skip its methods' keyword handling) and hier
(``all_reduce`` of the messages it sends flat, straight into its global level's backend).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.foundation.work import HostWaitedWork, TorchWork
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp


@dataclasses.dataclass(frozen=True)
class LaneOp:
    """One operation with a lane: its tensor arguments and what else it needs."""

    #: The ``TorchComm`` method (and backend method) name.
    name: str
    #: The tensor arguments; each must meet :data:`TENSOR`.
    tensors: tuple[str, ...]
    #: What the other arguments must be, in words (checked by :func:`build`'s lane).
    condition: str


#: What the communicator must be for any lane (otherwise its lane is ``None``).
COMMUNICATOR = (
    "on the CPU",
    "usable (not unbound, failed, finalized or aborted)",
    "no pre or post hooks registered",
    "call checking off (TORCHCOMM_CHECK_COLLECTIVES unset)",
)

#: What every lane call must be.
CALL = ("async_op=False", "timeout=None (the default timeout)", "hints=None (the default hints)")

#: What each tensor argument must be.
TENSOR = (
    "exactly a torch.Tensor (no subclass)",
    "on the CPU, strided, not nested, not a lazily negated view",
    "contiguous",
    "of a dtype the backend supports",
)

#: The operations with a lane.
TABLE: tuple[LaneOp, ...] = (
    LaneOp(
        "all_reduce",
        ("tensor",),
        "op is a ReduceOp whose reduction the backend runs natively and which is valid for "
        "the dtype (never PREMUL_SUM, which carries a factor to check)",
    ),
    LaneOp("broadcast", ("tensor",), "root is an int in [0, size)"),
    LaneOp(
        "all_to_all_single",
        ("output", "input"),
        "output and input have one dtype and one shape whose dim 0 divides by the size "
        "(they may overlap)",
    ),
    LaneOp(
        "all_gather_single",
        ("output", "input"),
        "output and input have one dtype; output has size times input's elements",
    ),
    LaneOp("barrier", (), "none"),
)

#: The names of the operations with a lane.
LEAN_OPS: tuple[str, ...] = tuple(op.name for op in TABLE)

_Tensor = torch.Tensor
_STRIDED = torch.strided


class Lane:
    """One communicator's lane: a function per operation of :data:`TABLE`.

    Each returns the completed :class:`TorchWork` of the call when the call qualifies
    (:data:`CALL` is the caller's to check), else ``None`` (take the general path).
    """

    __slots__ = ("all_reduce", "broadcast", "all_to_all_single", "all_gather_single", "barrier")

    def __init__(
        self,
        all_reduce: Callable[[Any, Any], TorchWork | None],
        broadcast: Callable[[Any, Any], TorchWork | None],
        all_to_all_single: Callable[[Any, Any], TorchWork | None],
        all_gather_single: Callable[[Any, Any], TorchWork | None],
        barrier: Callable[[], TorchWork | None],
    ) -> None:
        self.all_reduce = all_reduce
        self.broadcast = broadcast
        self.all_to_all_single = all_to_all_single
        self.all_gather_single = all_gather_single
        self.barrier = barrier


if Lane.__slots__ != LEAN_OPS:
    raise ImportError("torchcomms_core.comm.lean: Lane and TABLE disagree; add the lane to both")


def build(
    comm: Any,
    backend: Any,
    size: int,
    dtypes: frozenset[torch.dtype],
    pairs: frozenset[tuple[torch.dtype, RedOpType]],
    timeout: timedelta,
    hints: dict[str, str],
) -> Lane:
    """The lane of ``comm`` over ``backend`` for the given default ``timeout`` and ``hints``.

    ``pairs``: the ``(dtype, reduction)`` pairs all_reduce may pass as they are.
    """
    lean_calls = getattr(backend, "lean_calls", None)  # duck-typed backends lack it
    fast = lean_calls(timeout, dict(hints)) if lean_calls else {}
    fail = comm._raise_issue_error
    # Shared completed works: nothing about one changes, and it names no communicator
    # (whose backend would tell whether wait_blocking() means anything: the kind does).
    kind = TorchWork if getattr(backend, "supports_wait_blocking", False) else HostWaitedWork
    reduced = kind.completed(None, "all_reduce")
    broadcast_done = kind.completed(None, "broadcast")
    exchanged = kind.completed(None, "all_to_all_single")
    gathered = kind.completed(None, "all_gather_single")
    met = kind.completed(None, "barrier")

    def finish(inner: Any, name: str) -> TorchWork:
        work = TorchWork(inner, None, comm, name)
        work.wait()
        return work

    # What the lane calls: the backend's entry point, else its method with the defaults.
    reduce_fn = fast.get("all_reduce") or (
        lambda tensor, op: backend.all_reduce(tensor, op, False, timeout=timeout, hints=hints)
    )
    broadcast_fn = fast.get("broadcast") or (
        lambda tensor, root: backend.broadcast(tensor, root, False, timeout=timeout, hints=hints)
    )
    exchange_fn = fast.get("all_to_all_single") or (
        lambda output, input: backend.all_to_all_single(
            output, input, False, timeout=timeout, hints=hints
        )
    )
    gather_fn = fast.get("all_gather_single") or (
        lambda output, input: backend.all_gather_single(
            output, input, False, timeout=timeout, hints=hints
        )
    )
    barrier_fn = fast.get("barrier") or (
        lambda: backend.barrier(False, timeout=timeout, hints=hints)
    )

    # The TENSOR conditions are written out in each lane rather than in a helper: a call per
    # tensor would add a tenth to a lane call that costs about 1.4 us in all
    # (benchmarks/lean_lane.py).
    def all_reduce(tensor: Any, op: Any) -> TorchWork | None:
        if not (
            type(op) is ReduceOp
            and type(tensor) is _Tensor
            and tensor.is_cpu
            and tensor.layout is _STRIDED
            and not tensor.is_nested
            and not tensor.is_neg()
            and tensor.is_contiguous()
            and (tensor.dtype, op._type) in pairs
        ):
            return None
        try:
            inner = reduce_fn(tensor, op)
        except Exception as exc:
            fail(exc, "all_reduce")
        return reduced if inner is None else finish(inner, "all_reduce")

    def broadcast(tensor: Any, root: Any) -> TorchWork | None:
        if not (
            type(root) is int
            and 0 <= root < size
            and type(tensor) is _Tensor
            and tensor.is_cpu
            and tensor.layout is _STRIDED
            and not tensor.is_nested
            and not tensor.is_neg()
            and tensor.is_contiguous()
            and tensor.dtype in dtypes
        ):
            return None
        try:
            inner = broadcast_fn(tensor, root)
        except Exception as exc:
            fail(exc, "broadcast")
        return broadcast_done if inner is None else finish(inner, "broadcast")

    def all_to_all_single(output: Any, input: Any) -> TorchWork | None:
        if not (
            type(output) is _Tensor
            and type(input) is _Tensor
            and (dtype := input.dtype) is output.dtype
            and dtype in dtypes
            and input.is_cpu
            and output.is_cpu
            and input.layout is _STRIDED
            and output.layout is _STRIDED
            and not input.is_nested
            and not output.is_nested
            and not input.is_neg()
            and not output.is_neg()
            and input.is_contiguous()
            and output.is_contiguous()
            and (shape := input.shape) == output.shape
            and shape
            and not shape[0] % size
        ):
            return None
        try:
            inner = exchange_fn(output, input)
        except Exception as exc:
            fail(exc, "all_to_all_single")
        return exchanged if inner is None else finish(inner, "all_to_all_single")

    def all_gather_single(output: Any, input: Any) -> TorchWork | None:
        if not (
            type(output) is _Tensor
            and type(input) is _Tensor
            and (dtype := input.dtype) is output.dtype
            and dtype in dtypes
            and input.is_cpu
            and output.is_cpu
            and input.layout is _STRIDED
            and output.layout is _STRIDED
            and not input.is_nested
            and not output.is_nested
            and not input.is_neg()
            and not output.is_neg()
            and input.is_contiguous()
            and output.is_contiguous()
            and output.numel() == size * input.numel()
        ):
            return None
        try:
            inner = gather_fn(output, input)
        except Exception as exc:
            fail(exc, "all_gather_single")
        return gathered if inner is None else finish(inner, "all_gather_single")

    def barrier() -> TorchWork | None:
        try:
            inner = barrier_fn()
        except Exception as exc:
            fail(exc, "barrier")
        return met if inner is None else finish(inner, "barrier")

    return Lane(
        all_reduce=all_reduce,
        broadcast=broadcast,
        all_to_all_single=all_to_all_single,
        all_gather_single=all_gather_single,
        barrier=barrier,
    )
