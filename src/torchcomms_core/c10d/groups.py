"""Registering wrapped communicators in ``torch.distributed``'s world state.

A registered wrapper is a full process group: ``dist.*(group=pg)``, functional
collectives (resolved by group name), ``get_process_group_ranks`` and ``DeviceMesh``.
"""

from __future__ import annotations

from typing import cast

import torch

from torchcomms_core.c10d.backend_wrapper import _BackendWrapper
from torchcomms_core.c10d.world import describe, find_group, global_ranks_of
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommTypeError

__all__ = [
    "as_process_group",
    "describe",
    "find_group",
    "gather_global_ranks",
    "global_ranks_of",
    "new_wrapper",
    "register",
]


def as_process_group(
    comm: TorchComm, *, group_desc: str | None = None, group_name: str | None = None
) -> _BackendWrapper:
    """Return ``comm`` as a registered ``torch.distributed`` process group (one per comm).

    Collective over ``comm`` the first time (it learns the members' global ranks). If
    ``torch.distributed`` has no default group yet, ``comm`` must span the whole job and
    becomes the default (``dist.group.WORLD``), as ``DeviceMesh`` and FSDP2 need one.
    The group is named ``group_name`` (default: the communicator's name), with ``#2``,
    ``#3``... appended while another group has that name.
    """
    if not isinstance(comm, TorchComm):
        raise CommTypeError(
            f"as_process_group: expected a torchcomms TorchComm, got {type(comm).__name__}"
        )
    # Only our wrappers have get_comm, so a group found for a comm is one.
    existing = cast("_BackendWrapper | None", find_group(comm))
    if existing is not None:
        return existing
    import torch.distributed as dist

    size = comm.get_size()
    if not dist.is_initialized():
        found = _env.rank_and_size()
        world = found[1] if found is not None else size
        if size != world:
            raise CommInputError(
                f"as_process_group: torch.distributed has no default process group and "
                f"communicator {comm.get_name()!r} has {size} of the job's {world} ranks. "
                f"Wrap the communicator that spans every rank first (it becomes the default "
                f"group), or call torch.distributed.init_process_group()"
            )
        pg = new_wrapper(comm, group_desc or "default_pg", group_name)
        register(pg, list(range(size)), default=True)
        return pg
    global_ranks = gather_global_ranks(comm)
    pg = new_wrapper(comm, group_desc or "undefined", group_name)
    register(pg, global_ranks)
    return pg


def register(pg: _BackendWrapper, global_ranks: list[int], *, default: bool = False) -> None:
    """Enter ``pg`` into c10d's maps (and make it the default group if ``default``)."""
    from torch.distributed import distributed_c10d as c10d

    backend = pg.get_comm().get_backend()
    device = pg._device_types[0].type
    c10d._register_pg_in_world(
        pg,
        backend_name=backend,
        # c10d only records the store (pg_map); a comm created without one has none.
        store=pg.get_group_store(),  # type: ignore[arg-type]
        group_name=pg.group_name,
        backend_config=f"{device}:{backend}",
        rank_mapping={g: i for i, g in enumerate(global_ranks)},
        add_to_default_tag=default,
    )
    if default:
        c10d._update_default_pg(pg)
    else:  # as c10d records a subgroup's members in its backend's options
        pg._set_global_ranks(global_ranks)


def new_wrapper(comm: TorchComm, desc: str, base: str | None = None) -> _BackendWrapper:
    """A new wrapper of ``comm``, not yet registered, described as ``desc`` and named
    ``base`` (default: the communicator's name), with ``#2``, ``#3``... appended while
    ``torch.distributed`` has a group of that name."""
    from torch.distributed import distributed_c10d

    taken = set(distributed_c10d._world.pg_names.values())
    base = base or comm.get_name()
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}#{k}"
    pg = _BackendWrapper(comm)
    pg._set_group_name(name)
    pg._set_group_desc(desc)
    return pg


def gather_global_ranks(comm: TorchComm) -> list[int]:
    """Each member's rank in the default group, in ``comm``'s rank order (collective over
    ``comm``: every member calls it)."""
    import torch.distributed as dist

    me = torch.tensor([dist.get_rank()], dtype=torch.int64, device=comm.get_device())
    everyone = torch.empty(comm.get_size(), dtype=torch.int64, device=comm.get_device())
    comm.all_gather_single(everyone, me)
    return [int(r) for r in everyone.tolist()]
