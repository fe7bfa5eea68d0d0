"""Main-thread CPU of a call through the c10d bridge against the same call on plain gloo.

Under ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`` every ``torch.distributed`` call on a group
runs through ``_BackendWrapper`` over a torchcomms communicator. This measures what that
costs the calling thread: ``time.thread_time()`` (CPU time of the calling thread, which a
blocked wait does not add to) around many synchronous calls, the two groups interleaved
round by round in the same processes, median of the rounds. CPU time, unlike wall time, is
stable on a shared machine: the engine's own threads and other processes do not count.

    python benchmarks/bridge_cpu.py                   # 2 ranks, 1 KiB and 1 MiB
    python benchmarks/bridge_cpu.py --nproc 4 --calls 400 --rounds 9 --json cpu.json

Prints one row per operation and size: microseconds of main-thread CPU per call on the
bridge and on plain gloo, and their ratio (rank 0's figures; every rank runs the same).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

SIZES = {"1 KiB": 1 << 10, "1 MiB": 1 << 20}
OPS = (
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor SUM",
    "reduce_scatter_tensor AVG",
    "broadcast",
)


def _calls(group: Any, nbytes: int, size: int) -> dict[str, Callable[[], Any]]:
    import torch.distributed as dist

    n = max(size, nbytes // 4 // size * size)
    full = torch.ones(n)
    shard = torch.ones(n // size)
    out_full = torch.empty(n)
    out_shard = torch.empty(n // size)
    return {
        "all_reduce": lambda: dist.all_reduce(full, group=group),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out_full, shard, group=group),
        "reduce_scatter_tensor SUM": lambda: dist.reduce_scatter_tensor(
            out_shard, full, group=group
        ),
        "reduce_scatter_tensor AVG": lambda: dist.reduce_scatter_tensor(
            out_shard, full, op=dist.ReduceOp.AVG, group=group
        ),
        "broadcast": lambda: dist.broadcast(full, 0, group=group),
    }


def _rank(rank: int, size: int, port: int, calls: int, rounds: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed import config

    store = dist.TCPStore("127.0.0.1", port, size, rank == 0, timedelta(seconds=120))
    config.use_torchcomms = True
    dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
    bridged = dist.group.WORLD
    config.use_torchcomms = False
    plain = dist.new_group(backend="gloo")
    groups = {"bridge": (bridged, True), "gloo": (plain, False)}
    results: dict[str, dict[str, dict[str, float]]] = {}
    for label, nbytes in SIZES.items():
        table = {name: _calls(group, nbytes, size) for name, (group, _) in groups.items()}
        for op in OPS:
            samples: dict[str, list[float]] = {name: [] for name in groups}
            for r in range(rounds + 1):  # round 0 warms caches and allocators
                order = list(groups) if r % 2 == 0 else list(groups)[::-1]
                for name in order:
                    group, switch = groups[name]
                    config.use_torchcomms = switch
                    fn = table[name][op]
                    dist.barrier(group=group)
                    start = time.thread_time()
                    for _ in range(calls):
                        fn()
                    spent = time.thread_time() - start
                    if r:
                        samples[name].append(spent / calls * 1e6)
            results.setdefault(op, {})[label] = {
                name: statistics.median(xs) for name, xs in samples.items()
            }
    config.use_torchcomms = True
    dist.barrier()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", help="write the figures here as well")
    args = parser.parse_args()
    if os.environ.get("_BRIDGE_CPU_RANK") is not None:
        rank = int(os.environ["_BRIDGE_CPU_RANK"])
        _rank(
            rank,
            args.nproc,
            int(os.environ["_BRIDGE_CPU_PORT"]),
            args.calls,
            args.rounds,
            os.environ["_BRIDGE_CPU_OUT"],
        )
        return

    import subprocess
    import tempfile

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, *sys.argv[1:]],
                env={
                    **os.environ,
                    "_BRIDGE_CPU_RANK": str(r),
                    "_BRIDGE_CPU_PORT": str(port),
                    "_BRIDGE_CPU_OUT": out,
                },
            )
            for r in range(args.nproc)
        ]
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"a rank failed (exit codes {codes})")
        with open(out) as f:
            results = json.load(f)
    load = os.getloadavg()[0]
    print(
        f"main-thread CPU per synchronous call, us (median of {args.rounds} rounds of "
        f"{args.calls} calls, {args.nproc} ranks, load {load:.1f})"
    )
    print(f"{'operation':<28}{'size':>8}{'bridge':>10}{'gloo':>10}{'ratio':>8}")
    for op, by_size in results.items():
        for label, row in by_size.items():
            ratio = row["bridge"] / row["gloo"]
            print(f"{op:<28}{label:>8}{row['bridge']:>10.1f}{row['gloo']:>10.1f}{ratio:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": args.nproc, "load": load, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
