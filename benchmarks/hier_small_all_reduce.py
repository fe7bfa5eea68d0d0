"""8-byte all_reduce on ``hier`` against flat gloo, call by call, on one set of ranks.

``torchcomms bench --backend hier --compare gloo`` times the two backends in two passes one
after the other, so a change of the machine's load between the passes moves their ratio.
Here both communicators live on the same ranks at once (2 network namespaces of 2 ranks
joined by 1 Gbit/s links, as the bench's ``--netns 2 --ranks-per-host 2``) and the calls
alternate (``hier``, hier's global level, flat gloo, then the reverse order), so drift
falls on every path alike. Per path it prints the slowest rank's mean and median wall time
per call and the CPU time this thread spent per call (``time.thread_time_ns``), the part a
communicator's own layers add to. Needs root, ``ip`` and ``tc``::

    python benchmarks/hier_small_all_reduce.py [--calls 2000] [--link-rate 1gbit]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from datetime import timedelta

import torch

#: The paths timed, in the order of even calls (odd calls take the reverse order).
PATHS = ("hier", "hier global level", "flat gloo")


def rank_main(calls: int) -> int:
    """On one rank: build both communicators, time the paths alternately, print on rank 0."""
    import torchcomms
    from torchcomms import ReduceOp
    from torchcomms_hier import HierBackend

    timeout = timedelta(seconds=60)
    flat = torchcomms.new_comm("gloo", "cpu", name="flat", timeout=timeout)
    hier = torchcomms.new_comm("hier", "cpu", name="hier", timeout=timeout)
    impl = hier.get_backend_impl()
    assert isinstance(impl, HierBackend)
    glob = impl.levels()["global"]
    tensor = torch.ones(2)  # 8 bytes of float32
    op = ReduceOp.SUM
    calls_of: list[Callable[[], object]] = [
        lambda: hier.all_reduce(tensor, op),
        lambda: glob.all_reduce(tensor, op),
        lambda: flat.all_reduce(tensor, op),
    ]
    for call in calls_of:  # warm up every path
        for _ in range(50):
            call()
    wall: list[list[float]] = [[] for _ in PATHS]
    cpu = [0] * len(PATHS)
    clock, thread_clock = time.perf_counter_ns, time.thread_time_ns
    order = list(range(len(PATHS)))
    for i in range(calls):
        for k in order if i % 2 == 0 else order[::-1]:
            c0, t0 = thread_clock(), clock()
            calls_of[k]()
            t1, c1 = clock(), thread_clock()
            wall[k].append((t1 - t0) / 1e3)
            cpu[k] += c1 - c0
    mine = torch.tensor(
        [
            [statistics.fmean(w), statistics.median(w), c / calls / 1e3]
            for w, c in zip(wall, cpu, strict=True)
        ],
        dtype=torch.float64,
    )
    every = [torch.empty_like(mine) for _ in range(flat.get_size())]
    flat.all_gather(every, mine)
    if flat.get_rank() == 0:
        table = torch.stack(every)  # [rank, path, figure]
        slowest = table.max(dim=0).values
        print(f"# {calls} calls per path, {flat.get_size()} ranks; slowest rank per figure")
        print(f"# {'path':<20} {'mean us':>10} {'median us':>10} {'cpu us':>8} {'mean / flat':>12}")
        base = float(slowest[PATHS.index("flat gloo"), 0])
        for k, name in enumerate(PATHS):
            mean, median, cpu_us = (float(x) for x in slowest[k])
            print(f"  {name:<20} {mean:>10.1f} {median:>10.1f} {cpu_us:>8.1f} {mean / base:>12.2f}")
    hier.finalize()
    flat.finalize()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per path")
    parser.add_argument("--link-rate", default="1gbit", help="rate of each host's link")
    args = parser.parse_args()
    from torchcomms_core.bench.netns import launch_in_namespaces, shaped_network

    with shaped_network(2, args.link_rate, ranks_per_host=2) as net:
        return launch_in_namespaces(net, rank_main, (args.calls,), label="hier_small_all_reduce")


if __name__ == "__main__":
    sys.exit(main())
