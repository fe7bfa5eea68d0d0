"""DistributedDataParallel over a torchcomms communicator, checked against one process.

    torchrun --standalone --nproc-per-node 2 examples/ddp.py

Small buckets make DDP issue several all-reduces per step; the default communication
hook is installed explicitly, so gradients travel through ``Work.get_future()``.
"""

from __future__ import annotations

import argparse
import gc

import torch
import torch.distributed as dist
from _training import GLOBAL_BATCH, LR, batches, make_model, reference
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import torchcomms
from torchcomms.device_mesh import as_process_group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--bucket-cap-mb", type=float, default=0.01)
    args = parser.parse_args()

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="ddp")
    rank, size = comm.get_rank(), comm.get_size()
    # A process group over the comm (it spans the job, so it is also the default group).
    pg = as_process_group(comm)
    model = DistributedDataParallel(
        make_model(), process_group=pg, bucket_cap_mb=args.bucket_cap_mb
    )
    model.register_comm_hook(pg, default_hooks.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    ref = reference(args.steps)
    per = GLOBAL_BATCH // size
    worst = 0.0
    for i, (x, y) in enumerate(batches(args.steps)):
        loss = nn.functional.mse_loss(
            model(x[rank * per : (rank + 1) * per]), y[rank * per : (rank + 1) * per]
        )
        loss.backward()
        opt.step()
        opt.zero_grad()
        total = loss.detach()
        dist.all_reduce(total, op=dist.ReduceOp.AVG, group=pg)
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
            f"ddp over torchcomms matches the reference: {ok} (worst rel.diff {worst:.2e})",
            flush=True,
        )
    # Tear down in order while every rank is here: the model (DDP's reducer holds the
    # group), then the groups, then their engines (left for interpreter exit, an engine can
    # abort it).
    del model, opt, pg
    dist.destroy_process_group()
    gc.collect()
    if not ok:
        raise SystemExit(f"losses differ from the reference by up to {worst:.2e}")


if __name__ == "__main__":
    main()
