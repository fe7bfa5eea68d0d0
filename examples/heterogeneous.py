"""One job over hosts that each run their own backend (the ``hier`` backend).

Each host is launched by its own torchrun, which says which host it is and which backend its
ranks use among themselves; ``gloo`` carries the traffic between hosts. Two "hosts" on one
machine, ``shm`` on the first and ``gloo`` on the second::

    TORCHCOMM_HOST_ID=host-a TORCHCOMM_LOCAL_BACKEND=shm \\
      torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 \\
        --master-addr 127.0.0.1 --master-port 29531 examples/heterogeneous.py &
    TORCHCOMM_HOST_ID=host-b TORCHCOMM_LOCAL_BACKEND=gloo \\
      torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 \\
        --master-addr 127.0.0.1 --master-port 29531 examples/heterogeneous.py

On real hosts drop ``TORCHCOMM_HOST_ID`` (the host name groups the ranks) and point
``--master-addr`` at the first host. Each rank prints its levels, and rank 0 checks that a
gradient-sized all_reduce, an all_gather and a broadcast equal flat gloo's bit for bit.
See docs/heterogeneous.md.
"""

from __future__ import annotations

import argparse
import os

import torch

import torchcomms


def main() -> None:
    """Create the hierarchical communicator, show its levels, check results against gloo."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--elements", type=int, default=4 << 20, help="all_reduce size")
    args = parser.parse_args()
    device = torch.device("cpu")
    # The local backend comes from TORCHCOMM_LOCAL_BACKEND (or hints={"local_backend": ...}).
    comm = torchcomms.new_comm("hier", device, name="job", hints={"global_backend": "gloo"})
    flat = torchcomms.new_comm("gloo", device, name="flat")
    rank, size = comm.get_rank(), comm.get_size()
    impl = comm.get_backend_impl()
    levels = ", ".join(
        f"{role}={level.get_backend()}:{level.get_rank()}/{level.get_size()}"
        for role, level in impl.levels().items()
    )
    host = os.environ.get("TORCHCOMM_HOST_ID", "(host name)")
    print(f"rank {rank}/{size} on {host}: {levels}", flush=True)

    grads = torch.arange(args.elements, dtype=torch.int64) * (rank + 1)
    expected = grads.clone()
    comm.all_reduce(grads, torchcomms.ReduceOp.SUM)
    flat.all_reduce(expected, torchcomms.ReduceOp.SUM)

    mine = torch.full((3,), rank, dtype=torch.int32)
    gathered = torch.empty(3 * size, dtype=torch.int32)
    reference = torch.empty(3 * size, dtype=torch.int32)
    comm.all_gather_single(gathered, mine)
    flat.all_gather_single(reference, mine)

    weights = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    comm.broadcast(weights, size - 1)
    weights_flat = torch.randn(1000, generator=torch.Generator().manual_seed(rank))
    flat.broadcast(weights_flat, size - 1)

    same = (
        torch.equal(grads, expected)
        and torch.equal(gathered, reference)
        and torch.equal(weights, weights_flat)
    )
    verdict = torch.tensor([int(same)])
    comm.all_reduce(verdict, torchcomms.ReduceOp.MIN)
    if rank == 0:
        print(f"results equal flat gloo's on every rank: {bool(verdict.item())}", flush=True)
    flat.finalize()
    comm.finalize()
    if not verdict.item():
        raise SystemExit(1)


if __name__ == "__main__":
    main()
