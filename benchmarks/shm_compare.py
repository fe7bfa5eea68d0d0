"""shm, gloo and MPICH side by side on one host, in one run, with ratios.

For each rank count it starts ``mpiexec -n N`` on this script; in those same processes it
creates a ``shm`` and a ``gloo`` communicator (rendezvous through a store rank 0 hosts)
and measures raw MPICH through mpi4py on its own duplicate of ``MPI.COMM_WORLD``, the
way ``torchcomms bench --compare mpi4py`` calls it. Every round runs each operation on
the three implementations one after the other, so load drifts hit all three alike; the
figure printed is the median over rounds, and the ratios compare the medians.

Figures (nccl-tests conventions, ``size`` = the largest buffer of the call):

- busbw at ``--bytes`` (64 MiB): all_reduce (in place), all_gather_single,
  reduce_scatter_single, broadcast (root 0), all_to_all_single; float32;
- latency of an 8-byte all_reduce (2 float32), median over rounds of the mean per call;
- a one-thread memcpy (``Tensor.copy_``, what ``torchcomms bench --probe`` reports), and
  the fraction of it each shm busbw reaches.

- latency of a barrier, the same way;
- with ``--tuned``: shm on this host's tuning table (``torchcomms tune``, the tuner
  ``table``) against shm on its default rules (tuner ``none``), both communicators in the
  same processes and interleaved call by call with MPICH, so a machine whose speed changes
  between runs cannot favour either; ``TORCHCOMM_TUNING_DIR`` reaches the ranks;
- with ``--hog``: the same while one bounded busy loop per core runs (started before the
  ranks, stopped after them; each ends by itself after ``--hog-seconds`` at the latest),
  as on a machine other jobs keep busy.

    python benchmarks/shm_compare.py                 # 2 and 4 ranks
    python benchmarks/shm_compare.py --ranks 2 --rounds 3
    python benchmarks/shm_compare.py --ranks 2 --hog # a busy loop on every core
    python benchmarks/shm_compare.py --ranks 8       # 8 ranks (on however many cores)
    python benchmarks/shm_compare.py --ranks 2 --variant direct=algorithm.all_gather:direct
    torchcomms tune --backend shm --nproc 2 && python benchmarks/shm_compare.py --ranks 2 --tuned
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

IMPLS = ("shm", "gloo", "mpich")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--bytes", type=int, default=64 << 20, help="large message size")
    parser.add_argument("--iters", type=int, default=5, help="large calls timed per round")
    parser.add_argument("--lat-iters", type=int, default=500, help="8-byte calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--hints", default="", help="shm hints, k=v,k=v")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=k:v,k:v",
        help="another shm communicator with these hints, interleaved as its own column",
    )
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: keep)")
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument(
        "--policies",
        action="store_true",
        help="compare shm wait policies instead (spin, yield, sleep, spin+yield+sleep, default)",
    )
    parser.add_argument(
        "--tuned",
        action="store_true",
        help="compare shm on this host's tuning table with shm on its default rules, and MPICH",
    )
    parser.add_argument(
        "--hog", action="store_true", help="run a bounded busy loop on every core meanwhile"
    )
    parser.add_argument(
        "--hog-seconds", type=float, default=1800, help="each busy loop ends after this at most"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from torchcomms_core.bench.probe import memcpy_gbps

    copy = memcpy_gbps()
    load = os.getloadavg()
    print(
        f"# host {socket.gethostname()}, {os.cpu_count()} CPUs, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads"
    )
    print(f"# load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    print(f"# memcpy (copy_, 1 thread, 64 MiB): {copy:.2f} GB/s")
    hogs = start_hogs(args.hog_seconds) if args.hog else []
    if hogs:
        print(f"# {len(hogs)} busy loops running (one per core), at most {args.hog_seconds:g} s")
    try:
        run_all(args, copy)
    finally:
        stop_hogs(hogs)
    load = os.getloadavg()
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def start_hogs(seconds: float) -> list[subprocess.Popen[bytes]]:
    """One busy loop per core this process may use, each ending by itself after
    ``seconds`` (so none outlives a killed benchmark for long)."""
    loop = (
        "import time\n"
        f"end = time.monotonic() + {seconds!r}\n"
        "while time.monotonic() < end:\n"
        "    sum(range(1000))\n"
    )
    cores = len(os.sched_getaffinity(0))
    return [subprocess.Popen([sys.executable, "-c", loop]) for _ in range(cores)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    """End the busy loops (each by its own pid) and reap them."""
    for proc in hogs:
        proc.terminate()
    for proc in hogs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_all(args: argparse.Namespace, copy: float) -> None:
    for n in args.ranks:
        cmd = ["mpiexec", "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker"]
        cmd += ["--bytes", str(args.bytes), "--iters", str(args.iters)]
        cmd += ["--lat-iters", str(args.lat_iters), "--rounds", str(args.rounds)]
        if args.hints:
            cmd += ["--hints", args.hints]
        for variant in args.variant:
            cmd += ["--variant", variant]
        cmd += ["--threads", str(args.threads), "--impls", *args.impls]
        if args.policies:
            cmd += ["--policies"]
        if args.tuned:
            cmd += ["--tuned"]
        keep = ("TORCHCOMM_TUNING_DIR",)  # where `torchcomms tune` wrote this host's table
        env = {
            k: v
            for k, v in os.environ.items()
            if k in keep or not k.startswith(("TORCHCOMM_", "MASTER_"))
        }
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
        if res.returncode != 0:
            print(res.stdout[-3000:], res.stderr[-3000:])
            raise SystemExit(f"{n} ranks failed")
        line = [x for x in res.stdout.splitlines() if x.startswith("RESULT ")][-1]
        if args.policies:
            report_policies(n, json.loads(line[7:]), args.bytes)
        elif args.tuned:
            report_tuned(n, json.loads(line[7:]), args.bytes)
        else:
            report(n, json.loads(line[7:]), copy, args.bytes)
            if args.variant:
                report_variants(n, json.loads(line[7:]), copy, args.bytes)


def report(n: int, res: dict[str, Any], copy: float, nbytes: int) -> None:
    print(f"\n## {n} ranks, {nbytes >> 20} MiB float32, busbw GB/s (median of rounds)")
    print("| op | shm | gloo | MPICH | shm/MPICH | shm/gloo | shm/memcpy |")
    print("|---|---|---|---|---|---|---|")
    for op in OPS:
        s, g, m = (res[op].get(i, float("nan")) for i in IMPLS)
        print(
            f"| {op} | {s:.2f} | {g:.2f} | {m:.2f} | {s / m:.2f} | {s / g:.2f} | {s / copy:.2f} |"
        )
    for key, label in (("latency", "all_reduce 8 B"), ("barrier", "barrier")):
        s, g, m = (res[key].get(i, float("nan")) for i in IMPLS)
        print(
            f"| {label} latency (us) | {s:.1f} | {g:.1f} | {m:.1f} | {s / m:.2f} | {s / g:.3f} | |"
        )


def report_variants(n: int, res: dict[str, Any], copy: float, nbytes: int) -> None:
    """The ``--variant`` communicators beside shm's defaults and MPICH."""
    names = [k for k in res["all_reduce"] if k.startswith("shm:")]
    cols = ["shm", *names, "mpich"]
    print(f"\n## {n} ranks: shm variants, {nbytes >> 20} MiB busbw GB/s (median of rounds)")
    print("| op | " + " | ".join(cols) + " | " + " | ".join(f"{c}/MPICH" for c in cols[:-1]) + " |")
    print("|---" * (2 * len(cols)) + "|")
    for op in (*OPS, "latency"):
        vals = [res[op].get(c, float("nan")) for c in cols]
        ratios = [v / vals[-1] for v in vals[:-1]]
        print(
            f"| {op} | "
            + " | ".join(f"{v:.2f}" for v in vals)
            + " | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + " |"
        )


def report_tuned(n: int, res: dict[str, Any], nbytes: int) -> None:
    print(f"\n## {n} ranks, {nbytes >> 20} MiB float32, busbw GB/s (median of rounds)")
    print(
        "| op | shm, table | shm, defaults | MPICH | table/defaults | table/MPICH "
        "| defaults/MPICH |"
    )
    print("|---|---|---|---|---|---|---|")
    for op in OPS:
        t, d, m = (res[op].get(i, float("nan")) for i in ("shm", "shm-default", "mpich"))
        print(f"| {op} | {t:.2f} | {d:.2f} | {m:.2f} | {t / d:.2f} | {t / m:.2f} | {d / m:.2f} |")
    for key, label in (("latency", "all_reduce 8 B"), ("barrier", "barrier")):
        t, d, m = (res[key].get(i, float("nan")) for i in ("shm", "shm-default", "mpich"))
        print(
            f"| {label} (us) | {t:.1f} | {d:.1f} | {m:.1f} | {t / d:.2f} | {t / m:.2f} "
            f"| {d / m:.2f} |"
        )


#: Wait policies compared by ``--policies``: shm hints (microseconds).
POLICIES = {
    "spin": "spin_us=1000000000",
    "yield": "spin_us=0,yield_us=1000000000",
    "sleep": "spin_us=0,yield_us=0",
    "spin50+yield300+sleep": "spin_us=50,yield_us=300",
    "default": "",
}


def report_policies(n: int, res: dict[str, Any], nbytes: int) -> None:
    names = list(POLICIES)
    print(f"\n## {n} ranks: shm wait policies (median of rounds); ratios to the default")
    print(
        "| figure | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"{p}/default" for p in names[:-1])
        + " |"
    )
    print("|---" * (2 * len(names)) + "|")
    for op, unit in (("all_reduce", f"{nbytes >> 20} MiB busbw GB/s"), ("latency", "8 B us")):
        vals = [res[op][p] for p in names]
        ratios = [v / vals[-1] for v in vals[:-1]]
        print(
            f"| {op} {unit} | "
            + " | ".join(f"{v:.2f}" for v in vals)
            + " | "
            + " | ".join(f"{r:.2f}" for r in ratios)
            + " |"
        )


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import torchcomms
    from torchcomms import ReduceOp

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    if args.threads:
        torch.set_num_threads(args.threads)
    port = 0
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(world.bcast(port, 0)))
    hints = dict(kv.split("=", 1) for kv in args.hints.split(",") if kv)
    cpu = torch.device("cpu")
    if args.tuned:
        hints = {**hints, "tuner": "table"}
    comms = {
        "shm": torchcomms.new_comm("shm", cpu, name="cmp-shm", hints=hints),
    }
    if args.tuned:
        defaults = {**hints, "tuner": "none"}
        comms["shm-default"] = torchcomms.new_comm("shm", cpu, name="cmp-dflt", hints=defaults)
    if "gloo" in args.impls:
        comms["gloo"] = torchcomms.new_comm("gloo", cpu, name="cmp-gloo")
    variants = []
    for text in args.variant:
        vname, _, spec = text.partition("=")
        extra = dict(kv.split(":", 1) for kv in spec.split(",") if kv)
        comms[f"shm:{vname}"] = torchcomms.new_comm("shm", cpu, name=f"cmp-{vname}", hints=extra)
        variants.append(f"shm:{vname}")
    mpi = world.Dup()
    count = args.bytes // 4
    part = count // n
    big = torch.ones(count)
    big_out = torch.empty(count)
    small_in = torch.ones(part)
    small_out = torch.empty(part)
    tiny = torch.ones(2)
    np_ = lambda t: t.numpy()  # noqa: E731

    def calls(impl: str) -> dict[str, Callable[[], None]]:
        if impl == "mpich":
            return {
                "all_reduce": lambda: mpi.Allreduce(MPI.IN_PLACE, np_(big), MPI.SUM),
                "all_gather": lambda: mpi.Allgather(np_(small_in), np_(big_out)),
                "reduce_scatter": lambda: mpi.Reduce_scatter_block(
                    np_(big), np_(small_out), MPI.SUM
                ),
                "broadcast": lambda: mpi.Bcast(np_(big), 0),
                "all_to_all": lambda: mpi.Alltoall(np_(big), np_(big_out)),
                "latency": lambda: mpi.Allreduce(MPI.IN_PLACE, np_(tiny), MPI.SUM),
                "barrier": lambda: mpi.Barrier(),
            }
        c = comms[impl]
        return {
            "all_reduce": lambda: c.all_reduce(big, ReduceOp.SUM, False),
            "all_gather": lambda: c.all_gather_single(big_out, small_in, False),
            "reduce_scatter": lambda: c.reduce_scatter_single(small_out, big, ReduceOp.SUM, False),
            "broadcast": lambda: c.broadcast(big, 0, False),
            "all_to_all": lambda: c.all_to_all_single(big_out, big, False),
            "latency": lambda: c.all_reduce(tiny, ReduceOp.SUM, False),
            "barrier": lambda: c.barrier(False),
        }

    ops: tuple[str, ...] = OPS
    if args.policies:
        ops = ("all_reduce",)
        comms.pop("gloo", None)
        for policy, text in POLICIES.items():
            extra = dict(kv.split("=", 1) for kv in text.split(",") if kv)
            comms[policy] = torchcomms.new_comm("shm", cpu, name=f"cmp-{policy}", hints=extra)
        impls: tuple[str, ...] = tuple(POLICIES)
    elif args.tuned:
        impls = ("shm", "shm-default", "mpich")
    else:
        impls = (*args.impls, *variants)
    table = {impl: calls(impl) for impl in impls}
    factor = {
        "all_reduce": 2 * (n - 1) / n,
        "all_gather": (n - 1) / n,
        "reduce_scatter": (n - 1) / n,
        "broadcast": 1.0,
        "all_to_all": (n - 1) / n,
    }
    samples: dict[str, dict[str, list[float]]] = {
        op: {i: [] for i in impls} for op in (*ops, "latency", "barrier")
    }

    def timed(fn: Callable[[], None], iters: int) -> float:
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = (time.perf_counter() - t0) / iters
        return world.allreduce(dt, MPI.MAX)

    for impl in impls:  # warm up: pages, connections
        for op in (*ops, "latency", "barrier"):
            timed(table[impl][op], 2)
    for _ in range(args.rounds):
        for op in ops:
            for impl in impls:
                t = timed(table[impl][op], args.iters)
                samples[op][impl].append(args.bytes / t * factor[op] / 1e9)
        for key in ("latency", "barrier"):
            for impl in impls:
                t = timed(table[impl][key], args.lat_iters)
                samples[key][impl].append(t * 1e6)
    result = {op: {i: statistics.median(v) for i, v in d.items()} for op, d in samples.items()}
    for c in comms.values():
        c.finalize()
    mpi.Free()
    if rank == 0:
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
