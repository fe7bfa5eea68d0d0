"""The cost of choosing an algorithm on the lean lane (#45), before and after, in one run.

Part 1, one process, CPU time only (``time.thread_time_ns``, minimum over repeats): an
8-byte ``all_reduce`` on the lean lane of a backend that completes at once (``fake``)

- *before*: its ``all_reduce`` is a method that calls the fake's (what a backend without
  algorithms costs);
- *after*: the same method first asks ``self.tuning.choose("all_reduce", nbytes, dtype)``,
  with the default rules, and again with a tuner answering (both cached per size bucket);
- and ``Tuning.choose`` alone.

Part 2, real ranks: an 8-byte ``all_reduce`` on shm's lean lane at 2 ranks, its tuning
(*after*) against a stand-in that answers the same choice without a lookup (*before*),
blocks of calls interleaved A/B, the median of the blocks' per-call wall time::

    python benchmarks/tuner_choice.py [--calls 20000] [--repeats 15] [--shm-calls 4000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.engines.fake import FakeBackend
from torchcomms_core.plugin import (
    Algorithm,
    Choice,
    OpAlgorithms,
    Query,
    Tuner,
    register_tuner,
)
from torchcomms_core.plugin_host.backends import register_backend

_ALGOS = {"all_reduce": OpAlgorithms((Algorithm("one_step"), Algorithm("chunked")), "one_step")}


class Before(FakeBackend):
    """The fake with a method of its own for all_reduce, choosing nothing."""

    def all_reduce(self, tensor: Any, op: Any, async_op: bool, **kw: Any) -> Any:
        return super().all_reduce(tensor, op, async_op, **kw)


class After(FakeBackend):
    """The same method, asking its tuning first as a backend does."""

    algorithms = _ALGOS

    def all_reduce(self, tensor: Any, op: Any, async_op: bool, **kw: Any) -> Any:
        self.tuning.choose("all_reduce", tensor.nbytes, tensor.dtype)
        return super().all_reduce(tensor, op, async_op, **kw)


class Always(Tuner):
    """Answers chunked for everything."""

    def choose(self, query: Query) -> Choice | None:
        return Choice("chunked")


def _per_call(fn: Callable[[], object], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - start) / calls)
    return best


def part1(calls: int, repeats: int) -> None:
    register_backend("tc-before", Before, override=True)
    register_backend("tc-after", After, override=True)
    register_tuner("tc-always", Always)
    hints = {"rank": "0", "size": "2"}
    before = torchcomms.new_comm("tc-before", "cpu", name="tc_b", hints=hints)
    after = torchcomms.new_comm("tc-after", "cpu", name="tc_a", hints={**hints, "tuner": "none"})
    tuned = torchcomms.new_comm(
        "tc-after", "cpu", name="tc_t", hints={**hints, "tuner": "tc-always"}
    )
    assert before.takes_lean_calls() and after.takes_lean_calls() and tuned.takes_lean_calls()
    t = torch.zeros(2)  # 8 bytes
    tuning = after.get_backend_impl().tuning
    choose, dtype = tuning.choose, t.dtype
    cases = {
        "before (no choice)": lambda: before.all_reduce(t, ReduceOp.SUM),
        "after (default rules)": lambda: after.all_reduce(t, ReduceOp.SUM),
        "after (a tuner answers)": lambda: tuned.all_reduce(t, ReduceOp.SUM),
        "Tuning.choose alone": lambda: choose("all_reduce", 8, dtype),
        "empty lambda (loop cost)": lambda: None,
    }
    figures = {name: 0.0 for name in cases}
    # Interleaved: every repeat measures every case once, the minimum per case is kept.
    for _ in range(repeats):
        for name, fn in cases.items():
            v = _per_call(fn, calls, 1)
            figures[name] = v if not figures[name] else min(figures[name], v)
    print(f"# part 1: fake backend, 8-byte all_reduce lean lane, {calls} calls x {repeats}")
    for name, v in figures.items():
        print(f"{name:>28}: {v:7.0f} ns CPU/call")
    base = figures["before (no choice)"]
    print(
        f"{'choosing costs':>28}: {figures['after (default rules)'] - base:7.0f} ns (default "
        f"rules), {figures['after (a tuner answers)'] - base:.0f} ns (a tuner answers)"
    )
    assert str(tuned.get_backend_impl().tuning.last["all_reduce"]) == "chunked"
    for c in (before, after, tuned):
        c.finalize()


class _Fixed:
    """A stand-in tuning: the same answer, no lookup (the *before* of part 2)."""

    def __init__(self, choice: Choice) -> None:
        self.choice = choice
        self.last: dict[str, Choice] = {}

    def choose(self, op: str, nbytes: int, dtype: Any) -> Choice:
        return self.choice


def shm_rank(calls: int, blocks: int) -> dict[str, float]:
    comm = torchcomms.new_comm("shm", "cpu", name="tc_shm")
    backend = comm.get_backend_impl()
    real = backend.tuning
    t = torch.zeros(2)
    comm.all_reduce(t, ReduceOp.SUM)
    fixed = _Fixed(real.last["all_reduce"])
    times: dict[str, list[float]] = {"before": [], "after": []}
    for i in range(2 * blocks):
        name = ("before", "after")[(i + i // 2) % 2]  # ABBA order
        backend.tuning = fixed if name == "before" else real
        comm.barrier()
        start = time.perf_counter()
        for _ in range(calls):
            comm.all_reduce(t, ReduceOp.SUM)
        times[name].append((time.perf_counter() - start) / calls * 1e6)
    backend.tuning = real
    comm.finalize()
    return {k: statistics.median(v) for k, v in times.items()}


def part2(calls: int, blocks: int) -> None:
    from torchcomms_core.testing import RankPool

    with RankPool(2) as pool:
        results = pool.run(shm_rank, calls, blocks, timeout=600)
    print(
        f"# part 2: shm, 2 ranks, 8-byte all_reduce lean lane, {blocks} blocks of {calls} "
        f"calls each way (ABBA); median per-call wall time, rank 0 / rank 1"
    )
    for name in ("before", "after"):
        print(f"{name:>28}: " + " / ".join(f"{r[name]:.2f} us" for r in results))
    delta = [r["after"] - r["before"] for r in results]
    print(f"{'choosing costs':>28}: " + " / ".join(f"{d * 1000:.0f} ns" for d in delta))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--shm-calls", type=int, default=4000)
    parser.add_argument("--shm-blocks", type=int, default=10)
    args = parser.parse_args()
    part1(args.calls, args.repeats)
    part2(args.shm_calls, args.shm_blocks)


if __name__ == "__main__":
    main()
