"""An unchanged torch.distributed script: the backend is the one string it is given.

``python c10d_names_script.py BACKEND`` under any launcher that sets RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (torchrun, or the tests' own). It imports nothing of
torchcomms: a backend name works because torchcomms registered it with c10d at
``import torch``. It runs plain collectives, a subgroup, DDP, FSDP2 and DTensor, and prints
one JSON line (``RESULT {...}``) that the tests compare across backends.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 3


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model: nn.Module, rank: int) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(STEPS):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)
        losses.append(total.item())
    return losses


def main() -> None:
    backend = sys.argv[1]
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    out: dict[str, object] = {"rank": rank, "backend": dist.get_backend()}

    t = torch.arange(1000, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(t)
    out["all_reduce"] = t.sum().item()
    gathered = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(gathered, torch.full((3,), rank, dtype=torch.int64))
    out["all_gather"] = [int(g[0]) for g in gathered]
    b = torch.full((5,), float(rank))
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b.tolist()

    pair = dist.new_group([0, 1])
    if rank < 2:
        u = torch.full((4,), rank + 1.0)
        dist.all_reduce(u, group=pair)
        out["subgroup"] = u.tolist()

    ddp = DDP(_model(), bucket_cap_mb=0.001)
    out["ddp_losses"] = _train(ddp, rank)
    out["ddp_param_sum"] = sum(p.detach().sum().item() for p in ddp.parameters())

    mesh = init_device_mesh("cpu", (world,))
    fsdp = _model()
    for layer in fsdp:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(fsdp, mesh=mesh)
    out["fsdp_losses"] = _train(fsdp, rank)

    full = torch.arange(world * 6, dtype=torch.float32).reshape(world * 2, 3)
    dt = distribute_tensor(full, mesh, [Shard(0)])
    dt = (dt * 2).redistribute(mesh, [Replicate()])
    out["dtensor"] = dt.to_local().sum().item()

    dist.barrier()
    out["group_type"] = type(dist.group.WORLD).__name__
    # What c10d says the group is, and (for ours) the name torchcomms knows it by.
    world_pg = dist.group.WORLD
    out["identity"] = [
        world_pg.name(),
        world_pg._get_backend_name(),
        dist.get_backend(world_pg),
        world_pg.get_comm().get_backend() if hasattr(world_pg, "get_comm") else None,
    ]
    dist.destroy_process_group()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
