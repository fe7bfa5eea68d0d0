"""``init_device_mesh``: a real ``torch.distributed`` ``DeviceMesh`` over torchcomms communicators.

Each mesh dimension is one communicator (e.g. made with ``split``); FSDP2, DTensor and
tensor parallelism then run their collectives on them through registered wrappers.
``create_torchcomm_process_group`` and ``flatten_with_comm`` are the reference's
helpers for registering one communicator as a group and for a flattened dimension; the
face exports them under the reference's names (``torchcomms.device_mesh``:
``_create_torchcomm_process_group``, ``_flatten_with_comm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchcomms_core.c10d.backend_wrapper import BackendWrapper
from torchcomms_core.c10d.groups import as_process_group
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation.errors import CommInputError, CommTypeError


def init_device_mesh(
    mesh_dim_comms: Sequence[TorchComm],
    mesh_dim_names: Sequence[str],
    _global_comm: TorchComm | None = None,
) -> Any:
    """Build a ``DeviceMesh`` whose dimension ``i`` runs on ``mesh_dim_comms[i]``.

    A 1-D mesh takes one communicator. An N-D mesh takes one per dimension plus
    ``_global_comm`` spanning every rank (needed unless ``torch.distributed`` already
    has a default group); the dimension communicators must tile the ranks as a grid.
    ``mesh.get_group(name)`` returns the process group over that dimension's comm.
    """
    comms = _check_comms(mesh_dim_comms)
    names = _check_names(mesh_dim_names, len(comms))
    if _global_comm is not None and not isinstance(_global_comm, TorchComm):
        raise CommTypeError(
            f"init_device_mesh: _global_comm must be a TorchComm, got {type(_global_comm).__name__}"
        )
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import GroupName

    device_type = comms[0].get_device().type
    global_comm = (
        _global_comm if _global_comm is not None else (comms[0] if len(comms) == 1 else None)
    )
    # As the reference does, each dimension's group is named (and described) by its
    # mesh dimension name; a 1-D mesh's communicator is also the global one.
    if global_comm is comms[0]:
        global_name: str | None = names[0]
    else:
        global_name = None
    if not dist.is_initialized():
        if global_comm is None:
            raise CommInputError(
                f"init_device_mesh: a {len(comms)}-D mesh needs _global_comm= (the "
                f"communicator spanning every rank, e.g. the one the dimensions were split "
                f"from) because torch.distributed has no default process group"
            )
        as_process_group(global_comm, group_name=global_name, group_desc=global_name)
    elif global_comm is not None:
        as_process_group(global_comm, group_name=global_name, group_desc=global_name)
    groups = [
        as_process_group(c, group_desc=n, group_name=n) for c, n in zip(comms, names, strict=True)
    ]
    my_rank = dist.get_rank()
    if len(comms) == 1:
        mesh = torch.tensor(dist.get_process_group_ranks(groups[0]), dtype=torch.int)
    else:
        mesh = _grid(comms, names, groups, my_rank, global_comm)
    device_mesh = DeviceMesh(
        device_type, mesh, mesh_dim_names=names, _init_backend=False, _rank=my_rank
    )
    device_mesh._dim_group_names = [GroupName(pg.group_name) for pg in groups]
    for pg in groups:
        device_mesh._pg_registry[pg.group_name] = pg
    return device_mesh


def create_torchcomm_process_group(
    comm: TorchComm,
    group_name: str,
    backend_str: str = "torchcomm",
    global_ranks_mapping: dict[int, int] | None = None,
) -> Any:
    """Register ``comm`` in ``torch.distributed`` as the process group ``group_name``.

    As in Meta's torchcomms: the group runs every operation on ``comm``, is recorded
    under backend ``backend_str`` and tag ``ptd:<group_name>``, and maps global ranks to
    ``comm``'s ranks by ``global_ranks_mapping`` (``{global rank: group rank}``; default
    the identity). Returns the group (a ``ProcessGroup``).
    """
    where = "_create_torchcomm_process_group"
    if not isinstance(comm, TorchComm):
        raise CommTypeError(f"{where}: expected a torchcomms TorchComm, got {type(comm).__name__}")
    if not isinstance(group_name, str) or not group_name:
        raise CommTypeError(f"{where}: group_name must be a non-empty string, got {group_name!r}")
    if not isinstance(backend_str, str) or not backend_str:
        raise CommTypeError(f"{where}: backend_str must be a non-empty string, got {backend_str!r}")
    size = comm.get_size()
    mapping = _check_mapping(global_ranks_mapping, size, where)
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    if group_name in c10d._world.pg_names.values():
        raise CommInputError(
            f"{where}: a process group named {group_name!r} is already registered; pass a "
            f"name no other group uses (e.g. {group_name + '_' + comm.get_name()!r})"
        )
    if dist.is_initialized():
        me = dist.get_rank()
        if mapping.get(me) != comm.get_rank():
            raise CommInputError(
                f"{where}: global_ranks_mapping maps this rank (global rank {me}) to "
                f"{mapping.get(me)}, but it is rank {comm.get_rank()} of communicator "
                f"{comm.get_name()!r}; map every member's global rank to its rank in comm"
            )
    pg = BackendWrapper(comm)
    pg._set_group_name(group_name)
    pg._set_group_desc(group_name)
    set_ranks = getattr(pg, "_set_global_ranks", None)  # recorded in the group's options
    if set_ranks is not None:
        set_ranks([g for g, _ in sorted(mapping.items(), key=lambda kv: kv[1])])
    c10d._register_pg_in_world(
        pg,
        backend_name=backend_str,
        # c10d only records the store; a communicator without one is recorded with None.
        store=pg.get_group_store(),  # type: ignore[arg-type]
        group_name=c10d.GroupName(group_name),
        backend_config=f"{comm.get_device().type}:{backend_str}",
        rank_mapping=mapping,
    )
    return pg


def _check_mapping(mapping: Any, size: int, where: str) -> dict[int, int]:
    if mapping is None:
        return {i: i for i in range(size)}
    if not isinstance(mapping, dict):
        raise CommTypeError(
            f"{where}: global_ranks_mapping must be a dict "
            f"{{global rank: group rank}}, got {type(mapping).__name__}"
        )
    ok = all(isinstance(k, int) and isinstance(v, int) and k >= 0 for k, v in mapping.items())
    if not ok or sorted(mapping.values()) != list(range(size)):
        raise CommInputError(
            f"{where}: global_ranks_mapping {mapping} must map one non-negative global rank "
            f"to each group rank 0..{size - 1} of the communicator"
        )
    return dict(mapping)


def flatten_with_comm(
    mesh: Any, mesh_dim_name: str, comm: TorchComm, global_ranks: list[int], layout: Any
) -> Any:
    """Add to ``mesh``'s root a flattened 1-D dimension ``mesh_dim_name`` running on ``comm``.

    ``global_ranks`` are the global ranks of ``comm``'s members in its rank order (this
    rank's flattened group); ``layout`` is the flattened dimension's ``_MeshLayout`` (for
    a whole mesh, ``_MeshLayout([mesh._layout.collapse()])``; ``None`` means that).
    Afterwards ``root[mesh_dim_name]`` and ``root.get_group(mesh_dim_name)`` resolve to it.
    """
    where = "_flatten_with_comm"
    from torch.distributed.device_mesh import DeviceMesh

    if not isinstance(mesh, DeviceMesh):
        raise CommTypeError(f"{where}: mesh must be a DeviceMesh, got {type(mesh).__name__}")
    if not isinstance(comm, TorchComm):
        raise CommTypeError(f"{where}: expected a torchcomms TorchComm, got {type(comm).__name__}")
    root = mesh._get_root_mesh()
    if not isinstance(mesh_dim_name, str) or not mesh_dim_name:
        raise CommTypeError(
            f"{where}: mesh_dim_name must be a non-empty string, got {mesh_dim_name!r}"
        )
    if mesh_dim_name in (root.mesh_dim_names or ()) or mesh_dim_name in root._flatten_mapping:
        raise CommInputError(
            f"{where}: the mesh already has a dimension named "
            f"{mesh_dim_name!r}; choose another name"
        )
    ranks = list(global_ranks) if isinstance(global_ranks, (list, tuple)) else None
    if ranks is None or len(ranks) != comm.get_size() or not all(isinstance(r, int) for r in ranks):
        raise CommInputError(
            f"{where}: global_ranks must list the global rank of each of the "
            f"{comm.get_size()} members of communicator {comm.get_name()!r}, in its rank "
            f"order; got {global_ranks!r}"
        )
    if layout is None:
        from torch.distributed._mesh_layout import _MeshLayout

        layout = _MeshLayout([mesh._layout.collapse()])
    flat = DeviceMesh(
        root.device_type,
        _layout=layout,
        _rank_map=root._rank_map,
        mesh_dim_names=(mesh_dim_name,),
        _root_mesh=root,
        _init_backend=False,
    )
    expected = flat.mesh.tolist()
    if expected != ranks:
        raise CommInputError(
            f"{where}: layout {layout} puts this rank in the group {expected}, but "
            f"global_ranks is {ranks}; pass the global ranks of this rank's flattened group "
            f"(and a communicator over exactly them)"
        )
    pg = create_torchcomm_process_group(
        comm,
        _free_group_name(comm.get_name()),
        global_ranks_mapping={g: i for i, g in enumerate(ranks)},
    )
    flat._dim_group_names = [pg.group_name]
    root._pg_registry[pg.group_name] = pg
    root._flatten_mapping[mesh_dim_name] = flat
    return flat


def _free_group_name(base: str) -> str:
    from torch.distributed import distributed_c10d

    taken = set(distributed_c10d._world.pg_names.values())
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}#{k}"
    return name


def _check_comms(mesh_dim_comms: Any) -> list[TorchComm]:
    if isinstance(mesh_dim_comms, TorchComm) or not isinstance(mesh_dim_comms, (list, tuple)):
        raise CommTypeError(
            f"init_device_mesh: mesh_dim_comms must be a tuple of communicators, one per "
            f"dimension, e.g. (comm,); got {type(mesh_dim_comms).__name__}"
        )
    comms = list(mesh_dim_comms)
    if not comms:
        raise CommInputError(
            "init_device_mesh: mesh_dim_comms is empty; pass one communicator per mesh dimension"
        )
    for i, c in enumerate(comms):
        if not isinstance(c, TorchComm):
            raise CommTypeError(
                f"init_device_mesh: mesh_dim_comms[{i}] is a {type(c).__name__}, not a TorchComm"
            )
    kinds = {c.get_device().type for c in comms}
    if len(kinds) > 1:
        raise CommInputError(
            f"init_device_mesh: all dimensions must be on one device type, got {sorted(kinds)}"
        )
    return comms


def _check_names(mesh_dim_names: Any, ndim: int) -> tuple[str, ...]:
    if isinstance(mesh_dim_names, str) or not isinstance(mesh_dim_names, (list, tuple)):
        raise CommTypeError(
            f"init_device_mesh: mesh_dim_names must be a tuple of strings, "
            f"e.g. ('dp',); got {mesh_dim_names!r}"
        )
    names = tuple(mesh_dim_names)
    if len(names) != ndim:
        raise CommInputError(
            f"init_device_mesh: {ndim} communicators but {len(names)} "
            f"mesh_dim_names; give one name per dimension"
        )
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise CommInputError(
            f"init_device_mesh: mesh_dim_names {names} must be distinct, non-empty strings"
        )
    return names


def _grid(
    comms: list[TorchComm],
    names: tuple[str, ...],
    groups: list[Any],
    my_rank: int,
    global_comm: TorchComm | None,
) -> torch.Tensor:
    """The mesh of global ranks: each rank sits at its coordinates (its rank in each dim)."""
    import torch.distributed as dist

    shape = tuple(c.get_size() for c in comms)
    row = torch.tensor([my_rank, *(c.get_rank() for c in comms)], dtype=torch.int64)
    if global_comm is not None:
        device = global_comm.get_device()
        # Flat output: engines split it into chunks shaped like the input.
        everyone = torch.empty(
            global_comm.get_size() * row.numel(), dtype=torch.int64, device=device
        )
        global_comm.all_gather_single(everyone, row.to(device))
        everyone = everyone.cpu().view(-1, row.numel())
    else:
        everyone = torch.empty((dist.get_world_size(), row.numel()), dtype=torch.int64)
        dist.all_gather_into_tensor(everyone, row)
    total = 1
    for s in shape:
        total *= s
    if everyone.shape[0] != total:
        sizes = dict(zip(names, shape, strict=True))
        raise CommInputError(
            f"init_device_mesh: dimension sizes {sizes} multiply to {total} but the job has "
            f"{everyone.shape[0]} ranks"
        )
    mesh = torch.full(shape, -1, dtype=torch.int)
    for entry in everyone.tolist():
        rank, coords = entry[0], tuple(entry[1:])
        if mesh[coords] != -1:
            where = dict(zip(names, coords, strict=True))
            raise CommInputError(
                f"init_device_mesh: ranks {int(mesh[coords])} and {rank} both sit at {where}; "
                f"the dimension communicators must tile the ranks as a grid (split each "
                f"dimension from the global communicator)"
            )
        mesh[coords] = rank
    me = tuple(c.get_rank() for c in comms)
    for dim, pg in enumerate(groups):
        index: list[int | slice] = list(me)
        index[dim] = slice(None)
        expected = mesh[tuple(index)].tolist()
        actual = dist.get_process_group_ranks(pg)
        if expected != actual:
            raise CommInputError(
                f"init_device_mesh: dimension {names[dim]!r} holds ranks {actual} but the "
                f"grid needs {expected} there; each dimension communicator must contain the "
                f"ranks that differ only in that dimension's coordinate"
            )
    return mesh
