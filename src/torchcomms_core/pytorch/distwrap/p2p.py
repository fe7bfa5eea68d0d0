"""distwrap's point-to-point calls: ``send``/``recv``/``isend``/``irecv``, ``P2POp`` and
``batch_isend_irecv``, with ``torch.distributed``'s signatures (``group_dst``/``group_src``
too, and ``recv`` returning the sender's global rank)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from torchcomms_core.c10d.p2p_batch import P2PBatch
from torchcomms_core.c10d.work import CommWork
from torchcomms_core.comm import tagged
from torchcomms_core.comm.anysource import recv_anysource
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.pytorch.distwrap.routing import group_rank_of, on_group
from torchcomms_core.pytorch.distwrap.world import TorchCommsGroup, resolve

_NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def _peer(
    pg: TorchCommsGroup, rank: int | None, group_rank: int | None, what: str, arg: str
) -> int:
    """The group rank of a peer, which must be given (globally or in the group)."""
    return group_rank_of(pg, rank, group_rank, what, arg, default=None)


@on_group(dist.isend)
def isend(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Any:
    """Send ``tensor`` without waiting; returns a ``Work``."""
    peer = _peer(pg, dst, group_dst, "isend", "dst")
    work = tagged.send(pg.comm_for(tensor.device, "isend"), tensor, peer, tag, True)
    return CommWork([work], [tensor])


@on_group(dist.send)
def send(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    dst: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    """Send ``tensor`` and wait until it is sent."""
    peer = _peer(pg, dst, group_dst, "send", "dst")
    tagged.send(pg.comm_for(tensor.device, "send"), tensor, peer, tag, False)
    return None


@on_group(dist.irecv)
def irecv(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Any:
    """Receive into ``tensor`` without waiting (from any rank when ``src`` is ``None``)."""
    comm = pg.comm_for(tensor.device, "irecv")
    if src is None and group_src is None:
        work, source = recv_anysource(comm, tensor, True, tag=tag)
        return CommWork([work], [tensor], source_rank=lambda: pg.global_ranks[source()])
    peer = _peer(pg, src, group_src, "irecv", "src")
    work = tagged.recv(comm, tensor, peer, tag, True)
    return CommWork([work], [tensor], source_rank=pg.global_ranks[peer])


@on_group(lambda *args, **kwargs: int(dist.recv(*args, **kwargs)), non_member=-1)
def recv(
    pg: TorchCommsGroup,
    tensor: torch.Tensor,
    src: int | None = None,
    group: Any = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receive into ``tensor``; returns the sender's global rank."""
    comm = pg.comm_for(tensor.device, "recv")
    if src is None and group_src is None:
        work, source = recv_anysource(comm, tensor, False, tag=tag)
        work.wait()
        return pg.global_ranks[source()]
    peer = _peer(pg, src, group_src, "recv", "src")
    tagged.recv(comm, tensor, peer, tag, False)
    return pg.global_ranks[peer]


class P2POp:
    """One send or receive of a :func:`batch_isend_irecv` (``torch.distributed.P2POp``).

    ``op`` is :func:`isend` or :func:`irecv` (of distwrap or of ``torch.distributed``);
    the peer is a global rank (``peer``) or a rank in ``group`` (``group_peer``).
    """

    def __init__(
        self,
        op: Callable[..., Any],
        tensor: torch.Tensor,
        peer: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        if _kind(op) is None:
            raise CommTypeError(
                f"P2POp: op must be isend or irecv (torchcomms.distwrap's or "
                f"torch.distributed's), got {op!r}"
            )
        if not isinstance(tensor, torch.Tensor):
            raise CommTypeError(
                f"P2POp: tensor must be a torch.Tensor, got {type(tensor).__name__}"
            )
        if (peer is None) == (group_peer is None):
            raise CommInputError("P2POp: pass exactly one of peer= (global) or group_peer=")
        self.op = op
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        peer = f"peer={self.peer}" if self.peer is not None else f"group_peer={self.group_peer}"
        return f"P2POp({getattr(self.op, '__name__', self.op)}, {peer}, tag={self.tag})"


def _kind(op: Any) -> str | None:
    if op is isend or op is dist.isend:
        return "send"
    if op is irecv or op is dist.irecv:
        return "recv"
    return None


def batch_isend_irecv(p2p_op_list: list[Any]) -> list[Any]:
    """Issue every send and receive of the list together; returns their ``Work`` list.

    On a torchcomms group they form one ``batch_op_create()`` batch (one work, as c10d's
    coalesced path returns); otherwise ``torch.distributed.batch_isend_irecv`` runs them.
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise CommInputError("batch_isend_irecv: expects a non-empty list of P2POp")
    groups = {id(op.group) for op in p2p_op_list}
    if len(groups) != 1:
        raise CommInputError("batch_isend_irecv: every P2POp of one batch must use the same group")
    group = p2p_op_list[0].group
    if group is _NON_MEMBER:
        return []
    pg = resolve(group, "batch_isend_irecv")
    if pg is None:
        return list(dist.batch_isend_irecv([_to_c10d(op) for op in p2p_op_list]))
    comm = pg.comm_for(p2p_op_list[0].tensor.device, "batch_isend_irecv")
    batch = P2PBatch(comm, None, len(p2p_op_list))
    for i, op in enumerate(p2p_op_list):
        if not isinstance(op, (P2POp, dist.P2POp)):
            raise CommTypeError(
                f"batch_isend_irecv: item {i} must be a P2POp, got {type(op).__name__}"
            )
        tag = tagged.check_tag(op.tag, "batch_isend_irecv")
        tagged.require_tags(comm, tag, "batch_isend_irecv")
        peer = _peer(pg, op.peer, op.group_peer, "batch_isend_irecv", "peer")
        batch.add(_kind(op.op) or "recv", op.tensor, peer, tag)
    return [CommWork([batch.issue()], [op.tensor for op in p2p_op_list])]


def _to_c10d(op: Any) -> Any:
    if isinstance(op, dist.P2POp):
        return op
    fn = dist.isend if _kind(op.op) == "send" else dist.irecv
    return dist.P2POp(fn, op.tensor, op.peer, op.group, op.tag, op.group_peer)
