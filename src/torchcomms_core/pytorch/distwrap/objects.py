"""distwrap's object collectives, with ``torch.distributed``'s signatures.

On a torchcomms group they run ``torchcomms.objcol`` on the group's first communicator,
which deserialises safely (``weights_only``) unless ``TORCHCOMMS_SERIALIZATION=pickle``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from torchcomms_core.comm import objcol
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.pytorch.distwrap.routing import group_rank_of, on_group
from torchcomms_core.pytorch.distwrap.world import TorchCommsGroup


def _none(fn: Any) -> Any:
    """``fn`` answering ``None`` whatever it returns (distwrap's object calls do)."""

    def call(*args: Any, **kwargs: Any) -> None:
        fn(*args, **kwargs)

    return call


def _comm_on(pg: TorchCommsGroup, device: Any, what: str) -> TorchComm:
    """The communicator of ``device``, or the group's first one when none is given."""
    return pg.comm_for(device, what) if device is not None else pg.default_comm


@on_group(_none(dist.all_gather_object))
def all_gather_object(
    pg: TorchCommsGroup, object_list: list[Any], obj: Any, group: Any = None
) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``."""
    objcol.all_gather_object(pg.default_comm, object_list, obj)


@on_group(_none(dist.gather_object))
def gather_object(
    pg: TorchCommsGroup,
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """Collect every rank's ``obj`` into the destination's ``object_gather_list``."""
    root = group_rank_of(pg, dst, group_dst, "gather_object", "dst")
    objcol.gather_object(pg.default_comm, obj, root, object_gather_list)


@on_group(_none(dist.scatter_object_list))
def scatter_object_list(
    pg: TorchCommsGroup,
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Give rank ``k`` the source's ``scatter_object_input_list[k]`` (in output slot 0)."""
    root = group_rank_of(pg, src, group_src, "scatter_object_list", "src")
    objcol.scatter_object_list(
        pg.default_comm, root, scatter_object_output_list, scatter_object_input_list
    )


@on_group(_none(dist.broadcast_object_list))
def broadcast_object_list(
    pg: TorchCommsGroup,
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """Replace every rank's ``object_list`` items with the source's."""
    root = group_rank_of(pg, src, group_src, "broadcast_object_list", "src")
    objcol.broadcast_object_list(_comm_on(pg, device, "broadcast_object_list"), object_list, root)


@on_group(_none(dist.send_object_list))
def send_object_list(
    pg: TorchCommsGroup,
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    device: Any = None,
    group_dst: int | None = None,
) -> None:
    """Send the objects of ``object_list`` to one rank."""
    peer = group_rank_of(pg, dst, group_dst, "send_object_list", "dst")
    objcol.send_object_list(_comm_on(pg, device, "send_object_list"), object_list, peer)


@on_group(lambda *args, **kwargs: int(dist.recv_object_list(*args, **kwargs)), non_member=-1)
def recv_object_list(
    pg: TorchCommsGroup,
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> int:
    """Receive objects from one rank into ``object_list``; returns its global rank."""
    peer = group_rank_of(pg, src, group_src, "recv_object_list", "src")
    objcol.recv_object_list(_comm_on(pg, device, "recv_object_list"), object_list, peer)
    return pg.global_ranks[peer]
