"""A 2 x 2 DeviceMesh over torchcomms: FSDP2 on "dp", tensor parallel on "tp".

    torchrun --standalone --nproc-per-node 4 examples/mesh_2d.py

The dimension communicators are split from one global communicator; the losses are
checked against the same model trained in one process on the whole batch.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from _training import GLOBAL_BATCH, LR, batches, make_model, reference
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import torchcomms
from torchcomms.device_mesh import init_device_mesh

TP = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    world = torchcomms.new_comm("gloo", torch.device("cpu"), name="world")
    rank, size = world.get_rank(), world.get_size()
    if size % TP:
        raise SystemExit(f"run with a multiple of {TP} processes (got {size})")
    dp_size = size // TP
    dp_rank, tp_rank = divmod(rank, TP)
    # Rank r sits at (r // TP, r % TP): "tp" groups are rows, "dp" groups are columns.
    tp = world.split([dp_rank * TP + k for k in range(TP)], "tp")
    dp = world.split([k * TP + tp_rank for k in range(dp_size)], "dp")
    mesh = init_device_mesh((dp, tp), ("dp", "tp"), _global_comm=world)

    model = make_model()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    ref = reference(args.steps)
    per = GLOBAL_BATCH // dp_size
    worst = 0.0
    for i, (x, y) in enumerate(batches(args.steps)):
        # Ranks of one "tp" group see the same data; "dp" groups split the batch.
        loss = nn.functional.mse_loss(
            model(x[dp_rank * per : (dp_rank + 1) * per]), y[dp_rank * per : (dp_rank + 1) * per]
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=mesh.get_group("dp"))
        rel = abs(total.item() - ref[i]) / max(abs(ref[i]), 1e-12)
        worst = max(worst, rel)
        if rank == 0:
            print(
                f"step {i} loss {total.item():.8f} reference {ref[i]:.8f} rel.diff {rel:.2e}",
                flush=True,
            )
    ok = worst <= 1e-5
    if rank == 0:
        print(
            f"mesh {mesh.mesh.tolist()} over torchcomms matches the reference: {ok} "
            f"(worst rel.diff {worst:.2e})",
            flush=True,
        )
    dist.destroy_process_group()
    if not ok:
        raise SystemExit(f"losses differ from the reference by up to {worst:.2e}")


if __name__ == "__main__":
    main()
