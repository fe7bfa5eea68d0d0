"""Small collectives on shm: the communicator's calls and ``torch.distributed``'s, one run.

Starts ``--nproc`` ranks. Each makes the world group through PyTorch's switch
(``TORCH_DISTRIBUTED_USE_TORCHCOMMS``, backend ``cpu:shm``), a plain shm communicator and a
group on PyTorch's fake backend (PyTorch's own Python layer, no communication), and times,
interleaved round by round (wall clock, the slowest rank's mean per call, median of the
rounds):

- ``comm.all_reduce`` (the lean lane), ``comm.broadcast``, ``comm.all_gather_single`` and
  ``comm.barrier`` of ``--bytes`` (8: two float32) on the shm communicator, and the first
  three again on one with ``small_bytes=0`` (without the memoryview path);
- ``dist.all_reduce`` and ``dist.barrier`` on the bridged world group;
- ``dist.all_reduce`` on the fake group.

The goal of #44 for the bridge: ``dist.all_reduce`` within ``comm.all_reduce`` plus twice
the fake group's time.

    python benchmarks/shm_small.py                  # 2 ranks
    python benchmarks/shm_small.py --nproc 4 --calls 2000 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch


def _rank(rank: int, size: int, port: int, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed import config

    import torchcomms
    from torchcomms import ReduceOp

    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timedelta(seconds=120))
    config.use_torchcomms = True
    dist.init_process_group("cpu:shm", store=store, rank=rank, world_size=size)
    world = dist.group.WORLD
    config.use_torchcomms = False
    try:
        from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: F401

        fake: Any = dist.new_group(backend="fake")
    except Exception:  # noqa: BLE001 - no fake backend in this build: skip that row
        fake = None
    config.use_torchcomms = True
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size)
    )
    comm = torchcomms.new_comm("shm", torch.device("cpu"), name="small", store=store)
    # The same calls without the memoryview path (torch operators), for the threshold.
    general = torchcomms.new_comm(
        "shm", torch.device("cpu"), name="general", store=store, hints={"small_bytes": "0"}
    )
    n = max(1, args.bytes // 4)
    t = torch.ones(n)
    out_t = torch.empty(n * size)
    calls: dict[str, Callable[[], Any]] = {
        "comm.all_reduce": lambda: comm.all_reduce(t, ReduceOp.SUM),
        "comm.broadcast": lambda: comm.broadcast(t, 0),
        "comm.all_gather_single": lambda: comm.all_gather_single(out_t, t),
        "comm.barrier": lambda: comm.barrier(),
        "comm.all_reduce (small_bytes=0)": lambda: general.all_reduce(t, ReduceOp.SUM),
        "comm.broadcast (small_bytes=0)": lambda: general.broadcast(t, 0),
        "comm.all_gather_single (small_bytes=0)": lambda: general.all_gather_single(out_t, t),
        "dist.all_reduce": lambda: dist.all_reduce(t, group=world),
        "dist.barrier": lambda: dist.barrier(group=world),
    }
    if fake is not None:
        calls["dist.all_reduce (fake group)"] = lambda: dist.all_reduce(t, group=fake)
    samples: dict[str, list[float]] = {k: [] for k in calls}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name, fn in calls.items():
            comm.barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                fn()
            spent = (time.perf_counter() - start) / args.calls
            t.fill_(1.0)
            worst = torch.tensor([spent], dtype=torch.float64)
            comm.all_reduce(worst, ReduceOp.MAX)
            if r:
                samples[name].append(worst.item() * 1e6)
    result = {k: statistics.median(v) for k, v in samples.items()}
    general.finalize()
    comm.finalize()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(result, f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--bytes", type=int, default=8)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if os.environ.get("_SHM_SMALL_RANK") is not None:
        _rank(
            int(os.environ["_SHM_SMALL_RANK"]),
            args.nproc,
            int(os.environ["_SHM_SMALL_PORT"]),
            args,
            os.environ["_SHM_SMALL_OUT"],
        )
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHCOMM_", "MASTER_"))}
    env["TORCH_DISTRIBUTED_USE_TORCHCOMMS"] = "1"
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *sys.argv[1:]],
                env={
                    **env,
                    "_SHM_SMALL_RANK": str(r),
                    "_SHM_SMALL_PORT": str(port),
                    "_SHM_SMALL_OUT": out,
                },
            )
            for r in range(args.nproc)
        ]
        codes = [p.wait(timeout=1800) for p in procs]
        if any(codes):
            raise SystemExit(f"ranks failed: exit codes {codes}")
        with open(out) as f:
            result = json.load(f)
    print(f"# {args.nproc} ranks, {args.bytes} bytes, {args.calls} calls x {args.rounds} rounds")
    print(f"# load average before: {load[0]:.2f}; after: {os.getloadavg()[0]:.2f}")
    print("| call | us per call (median of rounds, slowest rank) |")
    print("|---|---|")
    for name, us in result.items():
        print(f"| {name} | {us:.1f} |")
    fake = result.get("dist.all_reduce (fake group)")
    if fake is not None:
        budget = result["comm.all_reduce"] + 2 * fake
        print(
            f"# dist.all_reduce {result['dist.all_reduce']:.1f} us against the goal "
            f"comm.all_reduce + 2 x fake = {budget:.1f} us "
            f"({result['dist.all_reduce'] / budget:.2f} of it)"
        )


if __name__ == "__main__":
    main()
