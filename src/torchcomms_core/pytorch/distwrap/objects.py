"""distwrap's object collectives, with ``torch.distributed``'s signatures.

On a torchcomms group they run ``torchcomms.objcol`` on the group's first communicator,
which deserialises safely (``weights_only``) unless ``TORCHCOMMS_SERIALIZATION=pickle``.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from torchcomms_core.comm import objcol
from torchcomms_core.pytorch.distwrap.collectives import root_rank
from torchcomms_core.pytorch.distwrap.world import resolve

_NON_MEMBER = dist.GroupMember.NON_GROUP_MEMBER


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill ``object_list`` (one slot per rank) with every rank's ``obj``."""
    if group is _NON_MEMBER:
        return None
    pg = resolve(group, "all_gather_object")
    if pg is None:
        dist.all_gather_object(object_list, obj, group)
        return None
    objcol.all_gather_object(pg.default_comm, object_list, obj)
    return None


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """Collect every rank's ``obj`` into the destination's ``object_gather_list``."""
    if group is _NON_MEMBER:
        return None
    pg = resolve(group, "gather_object")
    if pg is None:
        dist.gather_object(obj, object_gather_list, dst, group, group_dst)
        return None
    root = root_rank(pg, dst, group_dst, "gather_object", "dst")
    objcol.gather_object(pg.default_comm, obj, root, object_gather_list)
    return None


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Give rank ``k`` the source's ``scatter_object_input_list[k]`` (in output slot 0)."""
    if group is _NON_MEMBER:
        return None
    pg = resolve(group, "scatter_object_list")
    if pg is None:
        dist.scatter_object_list(
            scatter_object_output_list, scatter_object_input_list, src, group, group_src
        )
        return None
    root = root_rank(pg, src, group_src, "scatter_object_list", "src")
    objcol.scatter_object_list(
        pg.default_comm, root, scatter_object_output_list, scatter_object_input_list
    )
    return None


def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> None:
    """Replace every rank's ``object_list`` items with the source's."""
    if group is _NON_MEMBER:
        return None
    pg = resolve(group, "broadcast_object_list")
    if pg is None:
        dist.broadcast_object_list(object_list, src, group, device, group_src)
        return None
    root = root_rank(pg, src, group_src, "broadcast_object_list", "src")
    comm = pg.comm_for(device, "broadcast_object_list") if device is not None else pg.default_comm
    objcol.broadcast_object_list(comm, object_list, root)
    return None


def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    device: Any = None,
    group_dst: int | None = None,
) -> None:
    """Send the objects of ``object_list`` to one rank."""
    if group is _NON_MEMBER:
        return None
    pg = resolve(group, "send_object_list")
    if pg is None:
        dist.send_object_list(object_list, dst, group, device, group_dst)
        return None
    peer = root_rank(pg, dst, group_dst, "send_object_list", "dst")
    comm = pg.comm_for(device, "send_object_list") if device is not None else pg.default_comm
    objcol.send_object_list(comm, object_list, peer)
    return None


def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
) -> int:
    """Receive objects from one rank into ``object_list``; returns its global rank."""
    if group is _NON_MEMBER:
        return -1
    pg = resolve(group, "recv_object_list")
    if pg is None:
        return int(dist.recv_object_list(object_list, src, group, device, group_src))
    peer = root_rank(pg, src, group_src, "recv_object_list", "src")
    comm = pg.comm_for(device, "recv_object_list") if device is not None else pg.default_comm
    objcol.recv_object_list(comm, object_list, peer)
    return pg.global_ranks[peer]
