"""Reference-style use of ``objcol``, ``device_mesh`` helpers and the shipped hooks.

Each body is written against Meta's torchcomms API as its reference sheet gives it
(argument order, defaults, module layout) and runs on real gloo ranks.
"""

from __future__ import annotations

import json
import os
import pickle
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("ref"), **kwargs)


def _caught(fn, *args, **kwargs) -> tuple[str, str]:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # the test inspects type and message
        return type(exc).__name__, str(exc)
    return "no error", ""


def _cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# -- device_mesh -------------------------------------------------------------------------


def body_create_process_group() -> dict:
    from torch.distributed import distributed_c10d as c10d

    from torchcomms.device_mesh import _create_torchcomm_process_group, init_device_mesh

    try:
        world = _comm()
        init_device_mesh((world,), ("world",))
        r = world.get_rank()
        row = r // 2
        pair = world.split([2 * row, 2 * row + 1], unique_name("pair"))
        name = unique_name("grp")
        pg = _create_torchcomm_process_group(
            pair, name, global_ranks_mapping={2 * row: 0, 2 * row + 1: 1})
        t = torch.tensor([float(r + 1)])
        dist.all_reduce(t, group=pg)
        out = torch.empty(2, dtype=torch.int64)
        dist.all_gather_into_tensor(out, torch.tensor([r]), group=pg)
        plain = _create_torchcomm_process_group(_comm(), unique_name("plain"), "mybackend")
        return {
            "sum": t.item(), "order": out.tolist(),
            "backend": dist.get_backend(pg), "plain_backend": dist.get_backend(plain),
            "ranks": dist.get_process_group_ranks(pg),
            "plain_ranks": dist.get_process_group_ranks(plain),
            "tag": c10d._world.pg_to_tag[pg] == f"ptd:{name}",
            "resolved": c10d._resolve_process_group(name) is pg,
            "group_rank": dist.get_rank(pg), "comm": pg.get_comm() is pair,
            "duplicate": _caught(_create_torchcomm_process_group, pair, name),
            "swapped": _caught(_create_torchcomm_process_group, pair, unique_name("x"),
                               global_ranks_mapping={2 * row: 1, 2 * row + 1: 0}),
            "bad_mapping": _caught(_create_torchcomm_process_group, pair, unique_name("x"),
                                   global_ranks_mapping={0: 0}),
        }
    finally:
        _cleanup()


def test_create_torchcomm_process_group_registers_the_comm(pool4) -> None:
    for r, out in enumerate(pool4.run(body_create_process_group)):
        row = r // 2
        assert out["sum"] == float(4 * row + 3)
        assert out["order"] == [2 * row, 2 * row + 1]
        assert out["backend"] == "torchcomm" and out["plain_backend"] == "mybackend"
        assert out["ranks"] == [2 * row, 2 * row + 1] and out["plain_ranks"] == [0, 1, 2, 3]
        assert out["tag"] and out["resolved"] and out["comm"]
        assert out["group_rank"] == r % 2
        kind, message = out["duplicate"]
        assert kind == "CommInputError" and "already registered" in message
        kind, message = out["swapped"]
        assert kind == "CommInputError" and f"(global rank {r}) to {1 - r % 2}" in message
        kind, message = out["bad_mapping"]
        assert kind == "CommInputError" and "group rank 0..1" in message


def body_flatten_with_comm() -> dict:
    from torch.distributed._mesh_layout import _MeshLayout

    from torchcomms.device_mesh import _flatten_with_comm, init_device_mesh

    try:
        world = _comm()
        r = world.get_rank()
        row, col = divmod(r, 2)
        tp = world.split([row * 2, row * 2 + 1], "tp")
        dp = world.split([col, col + 2], "dp")
        mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
        flat_comm = world.split([0, 1, 2, 3], unique_name("flat"))
        layout = _MeshLayout([mesh._layout.collapse()])
        flat = _flatten_with_comm(mesh, "dp_tp", flat_comm, [0, 1, 2, 3], layout)
        group = mesh["dp_tp"].get_group()
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=group)
        again = _caught(_flatten_with_comm, mesh, "dp_tp", flat_comm, [0, 1, 2, 3], layout)
        wrong = _caught(_flatten_with_comm, mesh, "other", flat_comm, [3, 2, 1, 0], layout)
        return {"mesh": flat.mesh.tolist(), "names": flat.mesh_dim_names,
                "same": group.get_comm() is flat_comm, "sum": t.item(),
                "by_name": mesh.get_group("dp_tp") is group,
                "again": again, "wrong": wrong}
    finally:
        _cleanup()


def test_flatten_with_comm_adds_a_dimension_on_the_given_comm(pool4) -> None:
    for out in pool4.run(body_flatten_with_comm):
        assert out["mesh"] == [0, 1, 2, 3] and out["names"] == ("dp_tp",)
        assert out["same"] and out["by_name"] and out["sum"] == 6.0
        assert out["again"][0] == "CommInputError" and "already has" in out["again"][1]
        assert out["wrong"][0] == "CommInputError" and "global_ranks is" in out["wrong"][1]
