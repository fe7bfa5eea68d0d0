"""What the flight recorder costs a bridged call, A/B on one group in one process.

``benchmarks/bridge_cpu.py`` compares a bridged group with a plain gloo group. This one
keeps one bridged group (``TORCH_DISTRIBUTED_USE_TORCHCOMMS``'s, whose flight recorder
torch attaches) and switches its recorder off and on between rounds, on both ranks or on
one only, interleaved, so the engine, the tensors and the processes are the same in every
column. Rank 0's main-thread CPU (``time.thread_time()``) and wall time per synchronous
``all_reduce``, medians of the rounds::

    python benchmarks/bridge_fr_ab.py [--calls 300] [--rounds 24] [--numel 256]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

VARIANTS = ("recorder off", "recorder on", "on rank 0 only", "on rank 1 only")


def _rank(rank: int, port: int, calls: int, rounds: int, numel: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed import config

    from torchcomms.hooks import FlightRecorderHook

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=120))
    config.use_torchcomms = True
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    comm = dist.group.WORLD._get_backend(torch.device("cpu")).get_comm()
    hooks = FlightRecorderHook.attached_to(comm)
    if not hooks:
        raise SystemExit("no flight recorder is attached to the bridged group")
    t = torch.ones(numel)
    samples: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    for r in range(rounds + 1):  # round 0 warms up
        for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
            on = v == "recorder on" or v == f"on rank {rank} only"
            attached = bool(FlightRecorderHook.attached_to(comm))
            for hook in hooks:
                if on and not attached:
                    hook.register_with_comm(comm)
                elif not on and attached:
                    hook.unregister()
            dist.barrier()
            cpu, wall = time.thread_time(), time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            if r:
                samples[v].append(
                    (
                        (time.thread_time() - cpu) / calls * 1e6,
                        (time.perf_counter() - wall) / calls * 1e6,
                    )
                )
    if rank == 0:
        print(
            f"rank 0, all_reduce of {numel} float32, medians of {rounds} rounds of {calls} "
            f"calls (load {os.getloadavg()[0]:.1f})"
        )
        print(f"{'':>16}{'CPU us':>10}{'wall us':>10}")
        for v in VARIANTS:
            cpu_med = statistics.median(s[0] for s in samples[v])
            wall_med = statistics.median(s[1] for s in samples[v])
            print(f"{v:>16}{cpu_med:>10.1f}{wall_med:>10.1f}")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--numel", type=int, default=256)
    args = parser.parse_args()
    if "_FR_AB_RANK" in os.environ:
        _rank(
            int(os.environ["_FR_AB_RANK"]),
            int(os.environ["_FR_AB_PORT"]),
            args.calls,
            args.rounds,
            args.numel,
        )
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *sys.argv[1:]],
            env={**os.environ, "_FR_AB_RANK": str(r), "_FR_AB_PORT": str(port)},
        )
        for r in range(2)
    ]
    codes = [p.wait(timeout=600) for p in procs]
    if any(codes):
        raise SystemExit(f"a rank failed (exit codes {codes})")


if __name__ == "__main__":
    main()
