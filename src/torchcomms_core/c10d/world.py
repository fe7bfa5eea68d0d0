"""Lookups in ``torch.distributed``'s world state: which registered group wraps a comm.

A leaf module: the flight recorder and the group helpers read the world through it
without importing the process-group wrapper.
"""

from __future__ import annotations

from typing import Any

from torchcomms_core.comm.operations import TorchComm


def find_group(comm: TorchComm) -> Any:
    """The registered process group over ``comm`` (a ``_BackendWrapper``), or ``None``."""
    from torch.distributed import distributed_c10d

    for pg in distributed_c10d._world.pg_map:
        get_comm = getattr(pg, "get_comm", None)  # only our wrappers have it
        if get_comm is not None and get_comm() is comm:
            return pg
    return None


def global_ranks_of(comm: TorchComm) -> list[int] | None:
    """The global ranks of ``comm``'s members if it is registered, else ``None``."""
    pg = find_group(comm)
    if pg is None:
        return None
    from torch.distributed import distributed_c10d

    mapping: dict[int, int] = distributed_c10d._world.pg_group_ranks.get(pg, {})
    return [g for g, _ in sorted(mapping.items(), key=lambda kv: kv[1])]


def describe(comm: TorchComm) -> tuple[str, str, list[int] | None]:
    """``(group name, description, global ranks or None)`` of ``comm`` as c10d knows it."""
    pg = find_group(comm)
    if pg is None:
        return comm.get_name(), "undefined", None
    return str(pg.group_name), str(pg.group_desc), global_ranks_of(comm)
