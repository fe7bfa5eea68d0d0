"""FSDP2 (``fully_shard``) over a torchcomms communicator, checked against one process.

    torchrun --standalone --nproc-per-node 2 examples/fsdp2.py

Prints each step's loss beside the single-process reference, then times the same model
over torchcomms and over a plain gloo process group, step for step in turn.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
import torch.distributed as dist
from _training import GLOBAL_BATCH, LR, batches, make_model, reference
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

import torchcomms
from torchcomms.device_mesh import init_device_mesh


def sharded(mesh: DeviceMesh) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.SGD(model.parameters(), lr=LR)


def step(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    rank: int,
    size: int,
) -> torch.Tensor:
    per = GLOBAL_BATCH // size
    loss = nn.functional.mse_loss(
        model(x[rank * per : (rank + 1) * per]), y[rank * per : (rank + 1) * per]
    )
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss.detach()


def timing(
    ours: nn.Module,
    ours_opt: torch.optim.Optimizer,
    timing_steps: int,
    rank: int,
    size: int,
    group: dist.ProcessGroup,
) -> None:
    """Time ``ours`` against the same model over a plain gloo group, step for step in turn."""
    plain_mesh = DeviceMesh.from_group(
        dist.new_group(backend="gloo"), "cpu", mesh_dim_names=("dp",)
    )
    plain, plain_opt = sharded(plain_mesh)
    data = batches(timing_steps + 2)
    ours_s: list[float] = []
    plain_s: list[float] = []
    # Main-thread CPU per step (time.thread_time): what the bridge costs the caller,
    # steady on a shared machine where wall time is not.
    ours_cpu: list[float] = []
    plain_cpu: list[float] = []
    # Interleave the two so that machine load hits both alike, and alternate which goes
    # first: the step right after the barrier also absorbs the ranks' skew leaving it.
    for i, (x, y) in enumerate(data):
        first, second = ((ours, ours_opt), (plain, plain_opt))[:: 1 if i % 2 == 0 else -1]
        dist.barrier()
        start, cpu0 = time.perf_counter(), time.thread_time()
        step(*first, x, y, rank, size)
        middle, cpu1 = time.perf_counter(), time.thread_time()
        step(*second, x, y, rank, size)
        end, cpu2 = time.perf_counter(), time.thread_time()
        if i >= 2:  # the first steps warm caches and allocators
            a, b = middle - start, end - middle
            ours_s.append(a if i % 2 == 0 else b)
            plain_s.append(b if i % 2 == 0 else a)
            ca, cb = cpu1 - cpu0, cpu2 - cpu1
            ours_cpu.append(ca if i % 2 == 0 else cb)
            plain_cpu.append(cb if i % 2 == 0 else ca)
    # Per step, the slowest rank's time is the step's.
    times = torch.tensor([ours_s, plain_s], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)
    n = timing_steps
    if rank == 0:
        per_step = (times[0] / times[1]).median().item()
        print(
            f"per-step time: torchcomms {1e3 * times[0].sum() / n:.2f} ms, plain gloo "
            f"{1e3 * times[1].sum() / n:.2f} ms, ratio {times[0].sum() / times[1].sum():.2f} "
            f"(median of per-step ratios {per_step:.3f})",
            flush=True,
        )
        ours_c, plain_c = statistics.median(ours_cpu), statistics.median(plain_cpu)
        print(
            f"main-thread CPU per step (rank 0, median): torchcomms {1e3 * ours_c:.2f} ms, "
            f"plain gloo {1e3 * plain_c:.2f} ms, ratio {ours_c / plain_c:.2f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timing-steps", type=int, default=20)
    parser.add_argument(
        "--flight-recorder",
        action="store_true",
        help="record the communicator with torchcomms' flight recorder, as "
        "TORCH_DISTRIBUTED_USE_TORCHCOMMS=1 does for every group it makes",
    )
    args = parser.parse_args()

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="fsdp2")
    if args.flight_recorder:
        from torchcomms.hooks import FlightRecorderHook

        FlightRecorderHook().register_with_comm(comm)
    rank, size = comm.get_rank(), comm.get_size()
    # The comm spans the job, so it also becomes torch.distributed's default group.
    mesh = init_device_mesh((comm,), ("dp",))
    group = mesh.get_group("dp")

    model, opt = sharded(mesh)
    ref = reference(args.steps)
    worst = 0.0
    for i, (x, y) in enumerate(batches(args.steps)):
        loss = step(model, opt, x, y, rank, size)
        dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group)
        rel = abs(loss.item() - ref[i]) / max(abs(ref[i]), 1e-12)
        worst = max(worst, rel)
        if rank == 0:
            print(
                f"step {i} loss {loss.item():.8f} reference {ref[i]:.8f} rel.diff {rel:.2e}",
                flush=True,
            )
    ok = worst <= 1e-5
    if rank == 0:
        print(
            f"fsdp2 over torchcomms matches the reference: {ok} (worst rel.diff {worst:.2e})",
            flush=True,
        )

    if args.timing_steps > 0:
        timing(model, opt, args.timing_steps, rank, size, group)
    # Tear down in order while every rank is here: the models (their FSDP state holds the
    # groups), then the groups, then their engines. Engines left for interpreter exit can
    # abort it (a C++ thread destroyed while the runtime is going away).
    del model, opt, mesh, group
    dist.destroy_process_group()
    gc.collect()
    if not ok:
        raise SystemExit(f"losses differ from the reference by up to {worst:.2e}")


if __name__ == "__main__":
    main()
