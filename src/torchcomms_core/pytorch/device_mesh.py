"""``init_device_mesh``: a real ``torch.distributed`` ``DeviceMesh`` over torchcomms communicators.

Each mesh dimension is one communicator (e.g. made with ``split``); FSDP2, DTensor and
tensor parallelism then run their collectives on them through registered wrappers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..comm import TorchComm
from ..errors import CommInputError, CommTypeError
from .groups import as_process_group


def init_device_mesh(mesh_dim_comms: Sequence[TorchComm], mesh_dim_names: Sequence[str],
                     _global_comm: TorchComm | None = None) -> Any:
    """Build a ``DeviceMesh`` whose dimension ``i`` runs on ``mesh_dim_comms[i]``.

    A 1-D mesh takes one communicator. An N-D mesh takes one per dimension plus
    ``_global_comm`` spanning every rank (needed unless ``torch.distributed`` already
    has a default group); the dimension communicators must tile the ranks as a grid.
    ``mesh.get_group(name)`` returns the process group over that dimension's comm.
    """
    comms = _check_comms(mesh_dim_comms)
    names = _check_names(mesh_dim_names, len(comms))
    if _global_comm is not None and not isinstance(_global_comm, TorchComm):
        raise CommTypeError(f"init_device_mesh: _global_comm must be a TorchComm, got "
                            f"{type(_global_comm).__name__}")
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    device_type = comms[0].get_device().type
    global_comm = _global_comm if _global_comm is not None else (
        comms[0] if len(comms) == 1 else None)
    if not dist.is_initialized():
        if global_comm is None:
            raise CommInputError(
                f"init_device_mesh: a {len(comms)}-D mesh needs _global_comm= (the "
                f"communicator spanning every rank, e.g. the one the dimensions were split "
                f"from) because torch.distributed has no default process group"
            )
        as_process_group(global_comm)
    elif global_comm is not None:
        as_process_group(global_comm)
    groups = [as_process_group(c, group_desc=f"mesh_{n}")
              for c, n in zip(comms, names, strict=True)]
    my_rank = dist.get_rank()
    if len(comms) == 1:
        mesh = torch.tensor(dist.get_process_group_ranks(groups[0]), dtype=torch.int)
    else:
        mesh = _grid(comms, names, groups, my_rank, global_comm)
    device_mesh = DeviceMesh(device_type, mesh, mesh_dim_names=names, _init_backend=False,
                             _rank=my_rank)
    device_mesh._dim_group_names = [pg.group_name for pg in groups]
    for pg in groups:
        device_mesh._pg_registry[pg.group_name] = pg
    return device_mesh


def _check_comms(mesh_dim_comms: Any) -> list[TorchComm]:
    if isinstance(mesh_dim_comms, TorchComm) or not isinstance(mesh_dim_comms, (list, tuple)):
        raise CommTypeError(
            f"init_device_mesh: mesh_dim_comms must be a tuple of communicators, one per "
            f"dimension, e.g. (comm,); got {type(mesh_dim_comms).__name__}"
        )
    comms = list(mesh_dim_comms)
    if not comms:
        raise CommInputError("init_device_mesh: mesh_dim_comms is empty; pass one "
                             "communicator per mesh dimension")
    for i, c in enumerate(comms):
        if not isinstance(c, TorchComm):
            raise CommTypeError(f"init_device_mesh: mesh_dim_comms[{i}] is a "
                                f"{type(c).__name__}, not a TorchComm")
    kinds = {c.get_device().type for c in comms}
    if len(kinds) > 1:
        raise CommInputError(f"init_device_mesh: all dimensions must be on one device type, "
                             f"got {sorted(kinds)}")
    return comms


def _check_names(mesh_dim_names: Any, ndim: int) -> tuple[str, ...]:
    if isinstance(mesh_dim_names, str) or not isinstance(mesh_dim_names, (list, tuple)):
        raise CommTypeError(f"init_device_mesh: mesh_dim_names must be a tuple of strings, "
                            f"e.g. ('dp',); got {mesh_dim_names!r}")
    names = tuple(mesh_dim_names)
    if len(names) != ndim:
        raise CommInputError(f"init_device_mesh: {ndim} communicators but {len(names)} "
                             f"mesh_dim_names; give one name per dimension")
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise CommInputError(f"init_device_mesh: mesh_dim_names {names} must be distinct, "
                             f"non-empty strings")
    return names


def _grid(comms: list[TorchComm], names: tuple[str, ...], groups: list[Any], my_rank: int,
          global_comm: TorchComm | None) -> torch.Tensor:
    """The mesh of global ranks: each rank sits at its coordinates (its rank in each dim)."""
    import torch.distributed as dist

    shape = tuple(c.get_size() for c in comms)
    row = torch.tensor([my_rank, *(c.get_rank() for c in comms)], dtype=torch.int64)
    if global_comm is not None:
        device = global_comm.get_device()
        # Flat output: engines split it into chunks shaped like the input.
        everyone = torch.empty(global_comm.get_size() * row.numel(), dtype=torch.int64,
                               device=device)
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
        index = list(me)
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
