"""``torchcomms.device_mesh.init_device_mesh``: a real ``DeviceMesh`` over our communicators.

Groups come back as our wrappers, DTensor runs on them, and mistakes are explained
before any mesh is built.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms.device_mesh import as_process_group, init_device_mesh
from torchcomms_core.testing import unique_name


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("mesh"))


def _cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def body_1d_mesh_and_dtensor() -> list:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    try:
        comm = _comm()
        mesh = init_device_mesh((comm,), ("dp",))
        assert isinstance(mesh, DeviceMesh)
        group = mesh.get_group("dp")
        assert group.get_comm() is comm and dist.group.WORLD is group
        full = torch.arange(4.0 * comm.get_size()).view(-1, 2)
        dt = distribute_tensor(full, mesh, [Shard(0)])
        return [
            mesh.mesh.tolist(),
            mesh.get_local_rank("dp"),
            dt.to_local().tolist(),
            torch.equal(dt.full_tensor(), full),
            mesh.mesh_dim_names,
        ]
    finally:
        _cleanup()


def test_1d_mesh_groups_are_ours_and_dtensor_runs_on_them(pool) -> None:
    n = pool.world_size
    for r, (mesh, local, shard, same, names) in enumerate(pool.run(body_1d_mesh_and_dtensor)):
        assert mesh == list(range(n)) and local == r and same and names == ("dp",)
        assert shard == [[4.0 * r, 4.0 * r + 1], [4.0 * r + 2, 4.0 * r + 3]]


def body_2d_mesh_slices() -> list:
    try:
        world = _comm()
        r = world.get_rank()
        row, col = divmod(r, 2)
        tp = world.split([row * 2, row * 2 + 1], "tp")
        dp = world.split([col, col + 2], "dp")
        mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
        assert mesh["tp"].get_group().get_comm() is tp
        assert mesh.get_group("dp").get_comm() is dp
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=mesh.get_group("tp"))
        return [mesh.mesh.tolist(), mesh["dp"].mesh.tolist(), list(mesh.get_coordinate()), t.item()]
    finally:
        _cleanup()


def test_2d_mesh_places_ranks_by_their_dimension_ranks(pool4) -> None:
    res = pool4.run(body_2d_mesh_slices)
    for r, (mesh, dp_slice, coord, tp_sum) in enumerate(res):
        row, col = divmod(r, 2)
        assert mesh == [[0, 1], [2, 3]]
        assert dp_slice == [col, col + 2]
        assert coord == [row, col]
        assert tp_sum == float(4 * row + 1)


def body_mistakes() -> list:
    msgs = []
    comm = _comm()
    try:
        for args in [((comm,), ("a", "b")), (comm, ("a",)), ((comm, comm), ("a", "b"))]:
            try:
                init_device_mesh(*args)
            except (ValueError, TypeError) as exc:
                msgs.append(str(exc))
        half = comm.split([comm.get_rank()], "solo")
        try:
            as_process_group(half)
        except ValueError as exc:
            msgs.append(str(exc))
        half.finalize()
        return msgs
    finally:
        comm.finalize()
        _cleanup()


def test_mesh_mistakes_are_explained(pool2) -> None:
    names, not_tuple, no_global, partial = pool2.run(body_mistakes)[0]
    assert "1 communicators but 2 mesh_dim_names" in names
    assert "must be a tuple of communicators" in not_tuple
    assert "needs _global_comm=" in no_global
    assert "spans every rank" in partial


def test_init_device_mesh_checks_types_before_touching_torch_distributed() -> None:
    with pytest.raises(TypeError, match="tuple of communicators"):
        init_device_mesh("comm", ("dp",))  # type: ignore[arg-type]
