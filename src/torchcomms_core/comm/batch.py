"""Batched point-to-point: ``P2POpType``, ``P2POp`` and ``BatchSendRecv``.

A batch collects sends and receives and issues them together, so rings and exchanges
cannot deadlock. Backends receive the batch as plain ``("send"|"recv", tensor, peer)``
tuples (the spec's ``P2POp`` alias).
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.comm.base import CommBase
from torchcomms_core.comm.call import _in
from torchcomms_core.foundation.errors import CommTypeError
from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.options import BatchP2POptions, CallOptions


class P2POpType(enum.IntEnum):
    """Direction of one batched operation."""

    #: Send ``tensor`` to ``peer``.
    SEND = 0
    #: Receive into ``tensor`` from ``peer``.
    RECV = 1


_KIND = {P2POpType.SEND: "send", P2POpType.RECV: "recv"}


class P2POp:
    """One entry of a batch: ``P2POp(type, tensor, peer)``; fields are read/write."""

    __slots__ = ("type", "tensor", "peer")

    def __init__(self, type: P2POpType, tensor: torch.Tensor, peer: int) -> None:  # noqa: A002
        #: ``P2POpType.SEND`` or ``P2POpType.RECV`` (``0`` and ``1`` are converted to them).
        self.type = P2POpType(type)
        #: The tensor sent, or received into.
        self.tensor = tensor
        #: The other rank, in the communicator's numbering.
        self.peer = peer

    @property
    def kind(self) -> str:
        """``"send"`` or ``"recv"``, the spelling backends receive."""
        return _KIND[self.type]

    def __iter__(self) -> Any:
        # Unpacks like the backends' tuples: kind, tensor, peer.
        return iter((self.kind, self.tensor, self.peer))

    def __repr__(self) -> str:
        shape = tuple(self.tensor.shape) if isinstance(self.tensor, torch.Tensor) else "?"
        return f"P2POp({self.type.name}, tensor{shape}, peer={self.peer})"


class BatchSendRecv:
    """Sends and receives collected with ``send``/``recv`` and issued together."""

    def __init__(self, comm: CommBase) -> None:
        self._comm = comm
        self.ops: list[P2POp] = []

    def send(self, tensor: torch.Tensor, dst: int) -> BatchSendRecv:
        """Queue sending ``tensor`` to ``dst`` (checked now, sent by ``issue``); chainable."""
        return self._queue(P2POpType.SEND, "batch send", "dst", tensor, dst)

    def recv(self, tensor: torch.Tensor, src: int) -> BatchSendRecv:
        """Queue receiving into ``tensor`` from ``src`` (checked now, run by ``issue``)."""
        return self._queue(P2POpType.RECV, "batch recv", "src", tensor, src)

    def _queue(
        self, kind: P2POpType, what: str, peer_arg: str, tensor: torch.Tensor, peer: int
    ) -> BatchSendRecv:
        c = self._comm.checker
        c.tensor(what, "tensor", tensor)
        self.ops.append(
            P2POp(kind, tensor, c.peer(what, peer_arg, peer, allow_self=self._comm._self_p2p))
        )
        return self

    def issue(
        self,
        async_op: bool = False,
        options: CallOptions | None = None,
        *,
        hints: dict[str, str] | None = None,
        timeout: Any = None,
    ) -> TorchWork:
        """Issue every queued operation before waiting on any.

        Args:
            async_op: return at once with a work to wait on.
            options: a ``BatchP2POptions`` (``timeout`` zero = the communicator's).
            hints, timeout: the same as keywords (override ``options``).

        Returns:
            A ``TorchWork`` (completed already unless ``async_op``).
        """
        if options is not None:
            if not isinstance(options, CallOptions):
                raise CommTypeError(
                    f"issue: options must be a BatchP2POptions, got {type(options).__name__}"
                )
            opt_timeout, opt_hints = options.resolved()
            timeout = timeout if timeout is not None else opt_timeout
            hints = hints if hints is not None else opt_hints
        return issue_batch(self._comm, list(self.ops), async_op, timeout, hints)


def issue_batch(
    comm: CommBase,
    ops: list[Any],
    async_op: bool,
    timeout: timedelta | None,
    hints: dict[str, str] | None,
) -> TorchWork:
    call = comm._guard("batch_op_issue", timeout, hints)
    prepared = []
    for i, op in enumerate(ops):  # ``batch.ops`` is writable: check what it holds now
        if not isinstance(op, P2POp):
            raise CommTypeError(
                f"batch_op_issue: ops[{i}] must be a torchcomms.P2POp, got {type(op).__name__}"
            )
        comm.checker.tensor("batch_op_issue", f"ops[{i}].tensor", op.tensor)
        comm.checker.peer("batch_op_issue", f"ops[{i}].peer", op.peer, allow_self=comm._self_p2p)
    for kind, tensor, peer in ops:
        prepared.append((kind, _in(tensor) if kind == "send" else call.out(tensor), peer))
    if not prepared:
        return TorchWork(None, None, comm, "batch_op_issue")
    return comm._issue(call, (prepared,), async_op, (list(ops),))


__all__ = ["BatchP2POptions", "BatchSendRecv", "P2POp", "P2POpType"]
