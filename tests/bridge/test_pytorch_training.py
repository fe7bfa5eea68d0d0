"""Training over torchcomms communicators matches a single-process reference.

FSDP2 on a 1-D mesh, DDP with small buckets (with and without a comm hook) and a
2 x 2 mesh (FSDP2 on one dimension, tensor parallel on the other). Every rank computes
the reference itself: same seed, the whole global batch, one process.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

import torchcomms
from torchcomms.device_mesh import as_process_group, init_device_mesh
from torchcomms_core.testing import unique_name

STEPS = 4
GLOBAL_BATCH = 8
LR = 0.1


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)
    )


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [
        (torch.randn(GLOBAL_BATCH, 8, generator=gen), torch.randn(GLOBAL_BATCH, 4, generator=gen))
        for _ in range(STEPS)
    ]


def _reference() -> list[float]:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in _batches():
        loss = nn.functional.mse_loss(model(x), y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
        opt.zero_grad()
    return losses


def _train(model: nn.Module, shard: int, shards: int, loss_group) -> list[float]:
    """Train on this rank's slice of each global batch; return the global mean loss."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    per = GLOBAL_BATCH // shards
    losses = []
    for x, y in _batches():
        xs, ys = x[shard * per : (shard + 1) * per], y[shard * per : (shard + 1) * per]
        loss = nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=loss_group)
        losses.append(total.item())
    return losses


def _close(ours: list[float], ref: list[float]) -> bool:
    return len(ours) == len(ref) and all(
        math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-7) for a, b in zip(ours, ref, strict=True)
    )


def _cleanup(*comms) -> None:
    """Tear down in order: every rank in step, then the groups, then the communicators.

    Leaving the communicators to the garbage collector would tear engines down in whatever
    order objects die, possibly while a peer still uses its side.
    """
    try:
        for comm in comms:
            if comm is not None and not comm.is_finalized():
                comm.barrier()
    except torchcomms.TorchCommError:
        pass  # a rank failed earlier: its error is the one to report
    if dist.is_initialized():
        dist.destroy_process_group()
    for comm in comms:
        if comm is not None:
            comm.finalize()


def _counted(comm) -> dict:
    """Count the operations that reach ``comm`` (proof they ran on our communicator)."""
    counts: dict = {}
    comm.register_pre_hook(
        lambda name, op_id, args: counts.__setitem__(str(name), counts.get(str(name), 0) + 1)
    )
    return counts


def body_fsdp2() -> tuple:
    from torch.distributed.fsdp import fully_shard

    comm = None
    try:
        comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("fsdp"))
        counts = _counted(comm)
        mesh = init_device_mesh((comm,), ("dp",))
        model = _model()
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        losses = _train(model, comm.get_rank(), comm.get_size(), mesh.get_group("dp"))
        return losses, _reference(), counts, type(mesh.get_group("dp")).__name__
    finally:
        _cleanup(comm)


def test_fsdp2_over_torchcomms_matches_single_process(pool) -> None:
    for losses, ref, counts, kind in pool.run(body_fsdp2, timeout=120):
        assert _close(losses, ref), (losses, ref)
        assert kind == "_BackendWrapper"
        assert counts.get("all_gather_single", 0) > 0
        assert counts.get("reduce_scatter_single", 0) > 0


def body_ddp(hook: bool) -> tuple:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    comm = None
    try:
        comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("ddp"))
        counts = _counted(comm)
        pg = as_process_group(comm)
        ddp = DDP(_model(), process_group=pg, bucket_cap_mb=0.0005)
        if hook:
            ddp.register_comm_hook(pg, default_hooks.allreduce_hook)
        losses = _train(ddp, comm.get_rank(), comm.get_size(), pg)
        return losses, _reference(), counts
    finally:
        _cleanup(comm)


def test_ddp_with_small_buckets_matches_single_process(pool) -> None:
    for losses, ref, counts in pool.run(body_ddp, False, timeout=120):
        assert _close(losses, ref), (losses, ref)
        # More all-reduces than steps: several buckets per step, plus the loss.
        assert counts["all_reduce"] > 2 * STEPS


def test_ddp_with_a_comm_hook_matches_single_process(pool2) -> None:
    for losses, ref, _ in pool2.run(body_ddp, True, timeout=120):
        assert _close(losses, ref), (losses, ref)


def body_mesh_2d() -> tuple:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    world = tp = dp = None
    try:
        world = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("world"))
        r = world.get_rank()
        dp_rank, tp_rank = divmod(r, 2)
        tp = world.split([dp_rank * 2, dp_rank * 2 + 1], "tp")
        dp = world.split([tp_rank, tp_rank + 2], "dp")
        tp_counts, dp_counts = _counted(tp), _counted(dp)
        mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)
        model = _model()
        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        losses = _train(model, dp_rank, 2, mesh.get_group("dp"))
        return (losses, _reference(), mesh.mesh.tolist(), dict(tp_counts), dict(dp_counts))
    finally:
        _cleanup(tp, dp, world)


def test_2d_mesh_fsdp2_and_tensor_parallel_match_single_process(pool4) -> None:
    for losses, ref, mesh, tp_counts, dp_counts in pool4.run(body_mesh_2d, timeout=150):
        assert _close(losses, ref), (losses, ref)
        assert mesh == [[0, 1], [2, 3]]
        assert tp_counts.get("all_reduce", 0) > 0
        assert dp_counts.get("reduce_scatter_single", 0) > 0
