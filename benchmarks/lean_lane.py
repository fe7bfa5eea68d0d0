"""CPU time the core spends on a lean-lane call, with no engine time in it.

The ``fake`` backend completes every operation at once, so what is measured is the
communicator's own path: the lane's checks (``torchcomms_core.comm.lean``), the call into
the backend and the completed work. ``time.thread_time_ns()`` of this thread, the minimum
over repeats (the least disturbed run), per call::

    python benchmarks/lean_lane.py [--calls 50000] [--repeats 15]

Compare two checkouts by running it under each (``PYTHONPATH=<other>/src``).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

import torchcomms
from torchcomms import ReduceOp


def _per_call(fn: Callable[[], object], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - start) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50000, help="calls per repeat")
    parser.add_argument("--repeats", type=int, default=15, help="repeats (the minimum is kept)")
    args = parser.parse_args()
    comm = torchcomms.new_comm("fake", "cpu", name="lean_lane", hints={"rank": "0", "size": "2"})
    t, o = torch.zeros(4), torch.zeros(4)
    cases: dict[str, Callable[[], object]] = {
        "all_reduce": lambda: comm.all_reduce(t, ReduceOp.SUM),
        "broadcast": lambda: comm.broadcast(t, 0),
        "all_to_all_single": lambda: comm.all_to_all_single(o, t),
        "all_reduce (general path, async)": lambda: comm.all_reduce(t, ReduceOp.SUM, True),
    }
    print(f"# fake backend, 4 float32 elements, {args.calls} calls x {args.repeats}; CPU ns/call")
    for name, fn in cases.items():
        print(f"{name:>34}: {_per_call(fn, args.calls, args.repeats):7.0f} ns")
    comm.finalize()


if __name__ == "__main__":
    main()
