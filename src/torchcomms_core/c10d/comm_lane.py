"""The c10d bridge's communicator lane: c10d's calls straight into the communicator's lean lane.

A communicator whose backend has no c10d engine (shm, mpi, ...) cannot hand c10d's
arguments to an engine; its calls take the general path, which converts them, issues the
operation on the ``TorchComm`` and wraps its work in a ``CommWork``. For a plain
synchronous all-reduce or broadcast of one tensor on a communicator that takes lean calls
(``TorchComm.takes_lean_calls``: usable, no hooks, no call checking), most of that changes
nothing: this lane reads c10d's options inline, calls the communicator's own lean lane
(``comm.lean``) and returns a completed work holding the tensors. Whatever does not
qualify (an asynchronous call, a timeout, PREMUL_SUM, several tensors, a tensor the lean
lane refuses) returns ``None``, and the general path takes the call and raises its errors.

May import the core's operations and torch; not the rest of the bridge.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import ReduceOp as _C10dReduceOp
from torch._C._distributed_c10d import Work

from torchcomms_core.operations.reduce_op import ReduceOp

_ZERO = timedelta(0)

#: c10d's reduction kinds and ours (PREMUL_SUM, which carries a factor, is not here).
_OPS: dict[Any, ReduceOp] = {
    _C10dReduceOp.RedOpType.SUM: ReduceOp.SUM,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.PRODUCT: ReduceOp.PRODUCT,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.MIN: ReduceOp.MIN,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.MAX: ReduceOp.MAX,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.BAND: ReduceOp.BAND,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.BOR: ReduceOp.BOR,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.BXOR: ReduceOp.BXOR,  # type: ignore[attr-defined]
    _C10dReduceOp.RedOpType.AVG: ReduceOp.AVG,  # type: ignore[attr-defined]
}


class DoneWork(Work):
    """The c10d ``Work`` of a call the communicator lane completed: nothing to wait for."""

    def __init__(self, result: list[Any]) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> list[Any]:
        return list(self._result)

    def source_rank(self) -> int:
        return -1

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def block_current_stream(self) -> None:
        """Nothing to wait for."""

    def get_future(self) -> Any:
        """A future already completed with the tensors, as c10d's engines give one."""
        import torch

        fut: Any = torch.futures.Future()
        fut.set_result(self._result)
        return fut


def calls(lane: Any) -> dict[str, Callable[..., Work | None]]:
    """The communicator lane's calls over a ``comm.lean.Lane``, by c10d method name."""
    all_reduce = lane.all_reduce
    broadcast = lane.broadcast
    ops = _OPS

    def allreduce(tensors: Any, opts: Any = None) -> Work | None:
        if (
            opts is None
            or type(tensors) is not list
            or len(tensors) != 1
            or opts.asyncOp
            or opts.timeout > _ZERO
        ):
            return None
        op = ops.get(opts.reduceOp.op)
        if op is None or all_reduce(tensors[0], op) is None:
            return None
        return DoneWork(tensors)

    def bcast(tensors: Any, opts: Any = None) -> Work | None:
        if (
            opts is None
            or type(tensors) is not list
            or len(tensors) != 1
            or opts.asyncOp
            or opts.timeout > _ZERO
            or opts.rootTensor != 0
        ):
            return None
        if broadcast(tensors[0], opts.rootRank) is None:
            return None
        return DoneWork(tensors)

    return {"allreduce": allreduce, "broadcast": bcast}


def follow_lane_changes(owner: Any, comm: Any, update: Callable[[Any], object]) -> None:
    """Have ``comm`` call ``update(owner)`` on every change its lane listeners hear of,
    holding ``owner`` weakly (the communicator may outlive it) and stopping once it is
    gone."""
    handles: list[Any] = []
    ref = weakref.ref(owner, lambda _: [h.remove() for h in handles])

    def changed() -> None:
        alive = ref()
        if alive is not None:
            update(alive)

    handles.append(comm.register_lane_listener(changed))
