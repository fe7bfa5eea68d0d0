"""The control plane at scale, counted: store operations, bytes and keys per rank.

Simulates N ranks in one process: each rank is a thread with its own ``TCPStore`` client
(wrapped in :class:`~torchcomms_core.testing.CountingStore`) to one real ``TCPStore``
server, and its own real gloo engine (lazy by default: connections open on first use, so
a thousand engines fit in one machine). For each N it runs, in order and with all ranks
starting each step together:

- ``new_comm``: the world communicator;
- ``split/8``: the world split into groups of 8 ranks;
- ``split/all``: a split with every rank;
- ``all_reduce/8``: one all_reduce in each group of 8 (the engine's first connections);
- ``reconfigure``: a reconfigurable communicator bound to all N ranks, then reconfigured
  to the N-1 left after dropping the last (only the second one is counted).

It prints, per step and N: store operations per rank (mean and the most any rank did),
bytes per rank, the longest key, and the step's wall time (first start to last finish).
Then the store's own throughput on this machine, and from both a projection of
``new_comm`` + ``split/8`` at 10k and 100k ranks against one store (the model is in
docs/scaling.md).

    python benchmarks/scale.py                       # N = 16, 64, 256, 1024, lazy
    python benchmarks/scale.py --sizes 16 64 --eager # torch's eager full mesh
    python benchmarks/scale.py --json out.json       # the figures, for docs/scaling.md

Wall times are of threads sharing this machine's cores with the store; the counts do not
depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

STEPS = ("new_comm", "split/8", "split/all", "all_reduce/8", "reconfigure")


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need <= hard or (hard == resource.RLIM_INFINITY and soft < need):
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    elif need > hard:
        sys.exit(
            f"scale: {need} open files needed, the hard limit is {hard}; raise it "
            f"(ulimit -Hn, as root) or pass smaller --sizes"
        )


class _Job:
    """N threads, each a rank with its own counting store client."""

    def __init__(self, n: int, port: int, hints: dict[str, str], timeout: float) -> None:
        from torchcomms_core.testing import CountingStore

        self.n = n
        self.hints = hints
        self.timeout = timedelta(seconds=timeout)
        from concurrent.futures import ThreadPoolExecutor

        def client(_: int) -> CountingStore:
            return CountingStore(
                dist.TCPStore("127.0.0.1", port, None, False, self.timeout, wait_for_workers=False)
            )

        # In parallel: now and then a client's connect stalls for seconds in c10d's retry.
        with ThreadPoolExecutor(64) as pool:
            self.stores = list(pool.map(client, range(n)))
        self.barrier = threading.Barrier(n)
        self.state: list[dict[str, Any]] = [{} for _ in range(n)]

    def step(self, fn: Callable[[int, dict[str, Any], Any], None]) -> dict[str, Any]:
        """Run ``fn(rank, state, store)`` on every rank at once; counts and wall time."""
        from torchcomms_core.testing import simulated_rank

        starts = [0.0] * self.n
        ends = [0.0] * self.n
        before = [s.snapshot() for s in self.stores]
        for s in self.stores:
            s.reset_longest()
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            with simulated_rank(rank, self.n):
                self.barrier.wait()
                starts[rank] = time.perf_counter()
                try:
                    fn(rank, self.state[rank], self.stores[rank])
                except BaseException as exc:  # reported after the join
                    errors.append(exc)
                ends[rank] = time.perf_counter()

        threads = [
            threading.Thread(target=body, args=(r,), daemon=True, name=f"rank{r}")
            for r in range(self.n)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"{len(errors)} ranks failed; the first: {errors[0]!r}")
        deltas = [s.snapshot() - b for s, b in zip(self.stores, before, strict=True)]
        ops = [d.total for d in deltas]
        return {
            "ops_mean": statistics.fmean(ops),
            "ops_max": max(ops),
            "bytes_mean": statistics.fmean(d.bytes for d in deltas),
            "bytes_max": max(d.bytes for d in deltas),
            "longest_key": max(s.snapshot().longest_key for s in self.stores),
            "wall_s": max(ends) - min(starts),
            "kinds": dict(sum((d.ops for d in deltas), start=type(deltas[0].ops)())),
        }


def run_size(
    n: int, port: int, hints: dict[str, str], timeout: float, steps: tuple[str, ...] = STEPS
) -> dict[str, Any]:
    import torchcomms

    job = _Job(n, port, hints, timeout)
    tag = f"n{n}"
    results: dict[str, Any] = {}

    def world(rank: int, st: dict[str, Any], store: Any) -> None:
        st["world"] = torchcomms.new_comm(
            "gloo", "cpu", store=store, name=f"world_{tag}", hints=hints, timeout=job.timeout
        )

    def split8(rank: int, st: dict[str, Any], store: Any) -> None:
        first = rank // 8 * 8
        members = list(range(first, min(first + 8, n)))
        st["g8"] = st["world"].split(members, "g8")

    def split_all(rank: int, st: dict[str, Any], store: Any) -> None:
        st["all"] = st["world"].split(list(range(n)), "all")

    def all_reduce8(rank: int, st: dict[str, Any], store: Any) -> None:
        t = torch.ones(4)
        st["g8"].all_reduce(t, torchcomms.ReduceOp.SUM)
        expect = st["g8"].get_size()
        if float(t[0]) != expect:
            raise AssertionError(f"rank {rank}: all_reduce gave {float(t[0])}, not {expect}")

    handles: list[str] = [""] * n

    def make_reconfigurable(rank: int, st: dict[str, Any], store: Any) -> None:
        st["rc"] = torchcomms.new_comm(
            "gloo",
            "cpu",
            store=store,
            name=f"rc_{tag}",
            hints=hints,
            timeout=job.timeout,
            enable_reconfigure=True,
        )
        handles[rank] = st["rc"].get_init_handle()

    def bind_all(rank: int, st: dict[str, Any], store: Any) -> None:
        st["rc"].reconfigure(uuid="all", init_handles=list(handles)).wait()

    def drop_last(rank: int, st: dict[str, Any], store: Any) -> None:
        if rank == n - 1:
            st["rc"].abort()  # the rank that dies
            return
        st["rc"].reconfigure(uuid="less", init_handles=handles[:-1]).wait()
        if st["rc"].get_size() != n - 1:
            raise AssertionError(f"rank {rank}: reconfigured to size {st['rc'].get_size()}")

    results["new_comm"] = job.step(world)
    results["split/8"] = job.step(split8)
    results["split/all"] = job.step(split_all)
    results["all_reduce/8"] = job.step(all_reduce8)
    if "reconfigure" in steps:
        job.step(make_reconfigurable)
        job.step(bind_all)
        results["reconfigure"] = job.step(drop_last)

    def finish(rank: int, st: dict[str, Any], store: Any) -> None:
        for key in ("all", "g8", "world"):
            st[key].finalize()
        if rank != n - 1 and "rc" in st:
            st["rc"].finalize()

    job.step(finish)
    return results


_RANK_SCRIPT = """
import json, os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
import torchcomms
from torchcomms_core.testing import CountingStore
rank, size, port, lazy = (int(a) for a in sys.argv[1:5])
hints = {"lazy": "true" if lazy else "false"}
store = CountingStore(dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=600), False))
store.add("ready", 1)
store.wait(["go"])
out = {}
def step(name, fn):
    before, t0 = store.snapshot(), time.perf_counter()
    value = fn()
    out[name] = [time.perf_counter() - t0, (store.snapshot() - before).total]
    return value
world = step("new_comm", lambda: torchcomms.new_comm("gloo", "cpu", store=store, name="w",
                                                    hints=hints))
group = step("split/8", lambda: world.split(list(range(rank // 8 * 8, min(rank // 8 * 8 + 8,
                                                                          size))), "g8"))
t = torch.ones(1024)
step("all_reduce", lambda: world.all_reduce(t, torchcomms.ReduceOp.SUM))
assert float(t[0]) == size
group.finalize(); world.finalize()
print(json.dumps(out))
"""


def run_processes(n: int, lazy: bool) -> dict[str, Any]:
    """``n`` real rank processes: new_comm, split into groups of 8, one all_reduce of 4 KiB."""
    import subprocess

    server = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=600), False)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_GLOO", "TORCHCOMM"))}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK_SCRIPT, str(r), str(n), str(server.port), str(int(lazy))],
            stdout=subprocess.PIPE,
            env={**env, "TORCHCOMM_RANK": str(r), "TORCHCOMM_SIZE": str(n)},
            text=True,
        )
        for r in range(n)
    ]
    while int(server.add("ready", 0)) < n:  # every rank imported torch: time only the steps
        time.sleep(0.05)
    server.set("go", "1")
    results = []
    for p in procs:
        stdout, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise RuntimeError(f"a rank process failed (exit {p.returncode})")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return {
        step: {
            "wall_s": max(r[step][0] for r in results),
            "ops_max": max(r[step][1] for r in results),
        }
        for step in results[0]
    }


def store_rate(port: int, clients: int, seconds: float = 1.0) -> float:
    """Operations per second the store answers: ``clients`` threads doing ``add``."""
    stores = [
        dist.TCPStore("127.0.0.1", port, None, False, timedelta(seconds=30), False)
        for _ in range(clients)
    ]
    counts = [0] * clients
    stop = time.perf_counter() + seconds

    def body(i: int) -> None:
        s, done = stores[i], 0
        while time.perf_counter() < stop:
            s.add(f"rate/{i}", 1)
            done += 1
        counts[i] = done

    threads = [threading.Thread(target=body, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` (``b = 0`` from a single point)."""
    if len(xs) < 2:
        return ys[0], 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - b * mx, b


def _human(seconds: float) -> str:
    for unit, size in (("days", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.1f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    parser.add_argument("--eager", action="store_true", help="gloo's eager full mesh")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per step")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument(
        "--processes",
        type=int,
        default=0,
        metavar="N",
        help="instead: N real rank processes, eager against lazy (new_comm, split, all_reduce)",
    )
    parser.add_argument(
        "--no-reconfigure-above",
        type=int,
        default=None,
        metavar="N",
        help="skip the reconfigure step for sizes above N (a quadratic one takes hours)",
    )
    args = parser.parse_args()

    if args.processes:
        print(f"# {args.processes} rank processes, one TCPStore; load {os.getloadavg()[0]:.1f}")
        print(f"{'mode':<7}{'step':<12}{'wall s':>9}{'store ops (max)':>17}")
        both = {}
        for lazy in (False, True):
            mode = "lazy" if lazy else "eager"
            both[mode] = res = run_processes(args.processes, lazy)
            for step, r in res.items():
                print(f"{mode:<7}{step:<12}{r['wall_s']:>9.3f}{r['ops_max']:>17}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(both, f, indent=1)
        return
    # Say the mode in torch's variable too, so no build changes it while others read it.
    os.environ["TORCH_GLOO_LAZY_INIT"] = "0" if args.eager else "1"
    hints = {"lazy": "false" if args.eager else "true"}
    biggest = max(args.sizes)
    eager_sockets = biggest * biggest if args.eager else 0
    _raise_fd_limit(4 * biggest + eager_sockets + 256)
    server = dist.TCPStore(
        "127.0.0.1", 0, None, True, timedelta(seconds=args.timeout), wait_for_workers=False
    )
    port = int(server.port)
    print(f"# scale: gloo {'eager' if args.eager else 'lazy'}, threads as ranks, one TCPStore")
    print(f"# load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    figures: dict[str, Any] = {"mode": "eager" if args.eager else "lazy", "sizes": {}}
    header = (
        f"{'step':<13}{'N':>6}{'ops/rank':>10}{'max':>6}{'bytes/rank':>12}"
        f"{'longest key':>13}{'wall s':>9}"
    )
    print(header)
    for n in args.sizes:
        skip = args.no_reconfigure_above is not None and n > args.no_reconfigure_above
        res = run_size(n, port, hints, args.timeout, STEPS[:-1] if skip else STEPS)
        figures["sizes"][n] = res
        for step in STEPS:
            if step not in res:
                continue
            r = res[step]
            print(
                f"{step:<13}{n:>6}{r['ops_mean']:>10.1f}{r['ops_max']:>6}"
                f"{r['bytes_mean']:>12.0f}{r['longest_key']:>13}{r['wall_s']:>9.3f}"
            )
        sys.stdout.flush()
        if args.json:  # after every size, so a run stopped early keeps what it measured
            with open(args.json, "w") as f:
                json.dump(figures, f, indent=1)
    one = store_rate(port, 1)
    many = store_rate(port, 16)
    figures["store_ops_per_s"] = {"1": one, "16": many}
    print(f"# store: {one:,.0f} ops/s from 1 client, {many:,.0f} ops/s from 16 clients")
    sizes = sorted(figures["sizes"])
    per_rank = [
        figures["sizes"][n]["new_comm"]["ops_mean"] + figures["sizes"][n]["split/8"]["ops_mean"]
        for n in sizes
    ]
    a, b = _fit(sizes, per_rank)
    figures["fit"] = {"ops_per_rank_at_0": a, "ops_per_rank_per_rank": b}
    print(f"# new_comm + split/8 store ops per rank ~ {a:.2f} + {b:.4f} N (fit over N={sizes})")
    for ranks in (10_000, 100_000):
        ops = a + b * ranks
        seconds = max(ranks * ops / many, ops / one)  # the store's throughput, or one rank's
        figures.setdefault("projection_s", {})[ranks] = seconds
        print(
            f"# projected new_comm + split/8 at {ranks:,} ranks: {ranks:,} x {ops:,.1f} "
            f"ops / {many:,.0f} ops/s = {_human(seconds)}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)


if __name__ == "__main__":
    main()
