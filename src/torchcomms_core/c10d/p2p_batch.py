"""Point-to-point batches of the c10d bridge: ``batch_isend_irecv`` and coalescing blocks.

A torchcomms communicator issues a batch of sends and receives as one operation
(``batch_op_create``/``issue``), which backends whose sends block until matched (MPI's
large messages, NCCL groups) need to avoid deadlock. c10d hands a batch to a process group
one ``send``/``recv`` at a time; the bridge collects them and issues the batch once all
arrived (or when the next operation needs the communicator).
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchcomms_core.comm.operations import TorchComm
    from torchcomms_core.foundation.work import TorchWork

_batch_code: Any = None

#: The name of ``batch_isend_irecv``'s list argument, read from its frame.
P2P_LIST = "p2p_op_list"


def batch_isend_irecv_code() -> Any:
    """The code object of ``torch.distributed.batch_isend_irecv`` (unwrapped)."""
    global _batch_code
    if _batch_code is None:
        import inspect

        from torch.distributed import distributed_c10d

        _batch_code = inspect.unwrap(distributed_c10d.batch_isend_irecv).__code__
    return _batch_code


def enclosing_p2p_batch() -> list[Any] | None:
    """The ``p2p_op_list`` of a ``dist.batch_isend_irecv`` call running below us, if any.

    Why a frame is read: torch 2.13's ``batch_isend_irecv`` takes its coalescing path
    (``_start_coalescing``/``_end_coalescing``, which would bracket the batch for us) only
    when ``type(group) is ProcessGroup``, which no Python process group is; for any other
    group it calls ``isend``/``irecv`` one by one and nothing tells the group how many are
    coming. The list is a local of that call and the one place that says. If torch renames
    the function or the variable, this finds nothing and each send and receive is issued
    on its own (``tests/bridge/test_bridge_internals.py`` fails first, naming what changed).
    """
    code = batch_isend_irecv_code()
    frame: FrameType | None = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        if frame.f_code is code:
            ops = frame.f_locals.get(P2P_LIST)
            return ops if isinstance(ops, list) else None
        frame = frame.f_back
    return None


class P2PBatch:
    """Sends and receives collected from one ``batch_isend_irecv`` (or coalescing block).

    A batch whose operations all have tag 0 is issued as one batch of the communicator.
    One with tags (a backend that matches by tag: the bridge refused them elsewhere) is
    issued as tagged sends and receives, all posted before any is waited for: matching
    by tag, the order of posting does not matter.
    """

    __slots__ = ("_comm", "key", "expected", "ops", "_tags", "_work")

    def __init__(self, comm: TorchComm, key: Any, expected: int | None) -> None:
        self._comm = comm
        self.key = key
        self.expected = expected
        self.ops: list[tuple[str, torch.Tensor, int]] = []
        self._tags: list[int] = []
        self._work: Any = None

    def add(self, kind: str, tensor: torch.Tensor, peer: int, tag: int = 0) -> None:
        """Add a ``"send"`` or ``"recv"`` of ``tensor`` with ``peer`` under ``tag``."""
        self.ops.append((kind, tensor, peer))
        self._tags.append(tag)

    @property
    def full(self) -> bool:
        """Every operation of the batch has arrived."""
        return self.expected is not None and len(self.ops) >= self.expected

    def issue(self) -> Any:
        """Issue the batch once; the work of its one issue."""
        if self._work is None:
            if any(self._tags):
                self._work = self._issue_tagged()
            else:
                batch = self._comm.batch_op_create()
                for kind, tensor, peer in self.ops:
                    if kind == "send":
                        batch.send(tensor, peer)
                    else:
                        batch.recv(tensor, peer)
                self._work = batch.issue(async_op=True)
        return self._work

    def _issue_tagged(self) -> _Works:
        from torchcomms_core.comm import tagged

        works = []
        for (kind, tensor, peer), tag in zip(self.ops, self._tags, strict=True):
            issue = tagged.send if kind == "send" else tagged.recv
            works.append(issue(self._comm, tensor, peer, tag, True))
        return _Works(works)

    def wait(self) -> bool:
        return bool(self.issue().wait())

    def is_completed(self) -> bool:
        return bool(self.issue().is_completed())


class _Works:
    """The works of a tagged batch, waited for together."""

    __slots__ = ("_works",)

    def __init__(self, works: list[TorchWork]) -> None:
        self._works = works

    def wait(self) -> bool:
        error: BaseException | None = None
        for work in self._works:  # every one, so none is left in flight
            try:
                work.wait()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                error = error or exc
        if error is not None:
            raise error
        return True

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self._works)
