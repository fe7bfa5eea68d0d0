"""A plain torch.distributed training script: nothing in it mentions torchcomms.

    torchrun --standalone --nproc-per-node 2 examples/unchanged_script.py
    TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 torchrun --standalone --nproc-per-node 2 \\
        examples/unchanged_script.py

With the variable set, PyTorch creates every process group on torchcomms communicators;
the printed results are the same either way, only the "group type" lines differ.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def show(rank: int, name: str, value: object) -> None:
    if isinstance(value, torch.Tensor):
        value = [round(v, 6) for v in value.flatten().tolist()]
    # One write per line, so lines of different ranks never interleave.
    sys.stdout.write(f"rank {rank} {name}: {value}\n")
    sys.stdout.flush()


def main() -> None:
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()

    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    show(rank, "all_reduce", t)
    out = torch.empty(2 * size)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank)))
    show(rank, "all_gather_into_tensor", out)
    rs = torch.empty(2)
    dist.reduce_scatter_tensor(rs, torch.arange(2.0 * size) * (rank + 1))
    show(rank, "reduce_scatter_tensor", rs)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=size - 1)
    show(rank, "broadcast", b)
    objs = [None] * size
    dist.all_gather_object(objs, {"rank": rank})
    show(rank, "all_gather_object", objs)

    got = torch.empty(3)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % size),
            dist.P2POp(dist.irecv, got, (rank - 1) % size),
        ]
    )
    for req in reqs:
        req.wait()
    show(rank, "batch_isend_irecv", got)

    low = dist.new_group(list(range(size // 2)))
    high = dist.new_group(list(range(size // 2, size)))
    mine = low if rank < size // 2 else high
    s = torch.ones(1)
    dist.all_reduce(s, group=mine)
    show(rank, "new_group all_reduce", s)

    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)), bucket_cap_mb=0.001
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)
    for step in range(3):
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 2, generator=gen)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach()
        dist.all_reduce(total)
        show(rank, f"ddp step {step} loss sum", round(total.item(), 5))

    from torch.distributed import distributed_c10d

    show(rank, "group type", f"{type(dist.group.WORLD).__name__} {type(mine).__name__}")
    show(rank, "communicators", [type(c).__name__ for c in distributed_c10d._world.comms])
    dist.destroy_process_group(mine)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
