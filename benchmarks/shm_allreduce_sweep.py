"""all_reduce from 8 bytes to 64 MiB: shm against DeepSpeed's shm all-reduce, MPICH and
gloo, in the same processes, interleaved, with results checked (#57).

``mpiexec -n N`` starts this script; in those processes rank 0 hosts a store, and each rank
creates a ``shm`` and (with ``--gloo``) a ``gloo`` communicator, a duplicate of
``MPI.COMM_WORLD`` for MPICH (mpi4py), and, when the ``deepspeed`` package is installed,
DeepSpeed's communicator on a gloo process group with its shared-memory all-reduce
(``deepspeed.comm.inference_all_reduce``, the call AutoTP's ``LinearAllreduce`` makes; its
C++ op is built on first use). DeepSpeed takes the shared-memory path only when
``LOCAL_SIZE`` equals the world size (otherwise it silently falls back to gloo): this
script sets it, and says so if DeepSpeed reports the op missing.

For every size, each round times ``iters`` in-place float32 SUM all-reduces per
implementation, the implementations in a rotating order, so load drifts hit them alike; a
figure is the median over rounds of the mean time per call (the slowest rank's). Before
timing, every implementation's result on rank-dependent data is checked against the sum in
rank order: exactly for shm; to a relative 1e-5 for the others, which add in orders of
their own (MPICH's recursive doubling, DeepSpeed's kernel).

DeepSpeed leaves its ``/dev/shm`` segments behind; the script removes the ones this run
created (``deepspeed_allreduce_buffer_*`` files that were not there before it started).

    python benchmarks/shm_allreduce_sweep.py                    # 2 ranks
    python benchmarks/shm_allreduce_sweep.py --ranks 2 4 --rounds 7
    python benchmarks/shm_allreduce_sweep.py --hog              # a busy loop on every core
    python benchmarks/shm_allreduce_sweep.py --variant chunked=algorithm.all_reduce:chunked

The project never imports DeepSpeed; it is a benchmark-only peer
(``pip install --no-deps deepspeed==0.19.8 hjson ninja py-cpuinfo pydantic msgpack``).
"""

from __future__ import annotations

import argparse
import glob
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shm_compare import start_hogs, stop_hogs  # noqa: E402

SIZES = [8, 64, 512, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
IMPLS = ("shm", "deepspeed", "mpich", "gloo")


def _label(nbytes: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--min-bytes", type=int, default=0)
    parser.add_argument("--max-bytes", type=int, default=64 << 20)
    parser.add_argument("--gloo", action="store_true", help="gloo too (slow at small sizes)")
    parser.add_argument("--hints", default="", help="shm hints, k=v,k=v")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=k:v,k:v",
        help="another shm communicator with these hints, its own column (repeatable)",
    )
    parser.add_argument("--hog", action="store_true", help="a bounded busy loop on every core")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    from torchcomms_core.bench.probe import memcpy_gbps

    copy = memcpy_gbps()
    before = set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*"))
    load = os.getloadavg()
    print(f"# {os.cpu_count()} CPUs, torch {torch.__version__}; memcpy {copy:.2f} GB/s")
    print(f"# load average before: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    hogs = start_hogs(1800) if args.hog else []
    if hogs:
        print(f"# {len(hogs)} busy loops running (one per core)")
    out: dict[str, Any] = {"memcpy_gbps": copy, "runs": {}}
    try:
        for n in args.ranks:
            out["runs"][str(n)] = res = run(args, n)
            report(n, res)
    finally:
        stop_hogs(hogs)
        for path in set(glob.glob("/dev/shm/deepspeed_allreduce_buffer_*")) - before:
            os.unlink(path)
    load = os.getloadavg()
    out["load_after"] = load
    print(f"# load average after: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


def run(args: argparse.Namespace, n: int) -> dict[str, Any]:
    cmd = ["mpiexec", "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker"]
    cmd += ["--rounds", str(args.rounds), "--max-bytes", str(args.max_bytes)]
    cmd += ["--min-bytes", str(args.min_bytes)]
    if args.gloo:
        cmd += ["--gloo"]
    if args.hints:
        cmd += ["--hints", args.hints]
    for variant in args.variant:
        cmd += ["--variant", variant]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHCOMM_", "MASTER_"))}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-3000:])
        raise SystemExit(f"{n} ranks failed")
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return dict(json.loads(line[7:]))


def report(n: int, res: dict[str, Any]) -> None:
    impls = list(res["impls"])
    print(f"\n## {n} ranks, float32 SUM in place, us per call (median of rounds)")
    if res.get("note"):
        print(f"# {res['note']}")
    others = [i for i in impls if i != "shm"]
    print("| size | " + " | ".join(impls) + " | " + " | ".join(f"shm/{i}" for i in others) + " |")
    print("|---" * (len(impls) + len(others) + 1) + "|")
    for size in res["sizes"]:
        row = res["us"][str(size)]
        cells = " | ".join(f"{row[i]:.1f}" for i in impls)
        ratios = " | ".join(f"{row['shm'] / row[i]:.2f}" for i in others)
        print(f"| {_label(size)} | {cells} | {ratios} |")


def _iters(nbytes: int) -> int:
    """Calls per sample: about 20 ms of memory traffic, at least 5, at most 400."""
    return max(5, min(400, (20 << 20) // max(nbytes, 1 << 14)))


def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    import torchcomms
    from torchcomms import ReduceOp

    world = MPI.COMM_WORLD
    rank, n = world.Get_rank(), world.Get_size()
    ports = [0, 0]
    if rank == 0:
        for i in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports[i] = s.getsockname()[1]
    ports = world.bcast(ports, 0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]))
    cpu = torch.device("cpu")
    hints = dict(kv.split("=", 1) for kv in args.hints.split(",") if kv)
    comms = {"shm": torchcomms.new_comm("shm", cpu, name="sweep-shm", hints=hints)}
    if args.gloo:
        comms["gloo"] = torchcomms.new_comm("gloo", cpu, name="sweep-gloo")
    mpi = world.Dup()
    calls: dict[str, Callable[[torch.Tensor], None]] = {
        "shm": lambda t: comms["shm"].all_reduce(t, ReduceOp.SUM, False),
        "mpich": lambda t: mpi.Allreduce(MPI.IN_PLACE, t.numpy(), MPI.SUM),
    }
    if args.gloo:
        calls["gloo"] = lambda t: comms["gloo"].all_reduce(t, ReduceOp.SUM, False)
    variants = []
    for text in args.variant:
        name, _, spec = text.partition("=")
        extra = dict(kv.split(":", 1) for kv in spec.split(",") if kv)
        key = f"shm:{name}"
        comms[key] = torchcomms.new_comm("shm", cpu, name=f"sweep-{name}", hints=extra)
        calls[key] = lambda t, c=comms[key]: c.all_reduce(t, ReduceOp.SUM, False)
        variants.append(key)
    note = ""
    try:
        import deepspeed
        import deepspeed.comm as dscomm
    except ImportError:
        note = "deepspeed is not installed: no DeepSpeed column"
    else:
        # DeepSpeed's gloo group on a port of its own; LOCAL_SIZE = world size, or its
        # shared-memory op stays off and the call falls back to gloo.
        os.environ.update(
            RANK=str(rank),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(rank),
            LOCAL_SIZE=str(n),
            MASTER_PORT=str(ports[1]),
        )
        dscomm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
        level = getattr(dscomm.comm.cdb, "shm_vector_kernel_level", 0)
        if not hasattr(torch.ops.deepspeed, "inference_all_reduce_") or level < 1:
            note = "DeepSpeed's shm op is not in use (not built, or no AVX2): its column is gloo"
        calls["deepspeed"] = lambda t: dscomm.inference_all_reduce(t)
        note = note or f"deepspeed {deepspeed.__version__}, shm op on"
    impls = ["shm", *variants, *[i for i in IMPLS[1:] if i in calls]]

    def timed(fn: Callable[[torch.Tensor], None], t: torch.Tensor, iters: int) -> float:
        world.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn(t)
        dt = (time.perf_counter() - t0) / iters
        return float(world.allreduce(dt, MPI.MAX))

    sizes = [s for s in SIZES if args.min_bytes <= s <= args.max_bytes]
    us: dict[str, dict[str, float]] = {}
    bad: list[str] = []
    for size in sizes:
        count = size // 4
        gen = torch.Generator().manual_seed(size)
        data = [torch.randn(count, generator=gen) for _ in range(n)]
        want = data[0].clone()
        for d in data[1:]:
            want += d
        for impl in impls:  # the result first, then warm-up calls
            t = data[rank].clone()
            calls[impl](t)
            exact = impl.startswith("shm")  # in rank order; the others in their own orders
            ok = torch.equal(t, want) if exact else torch.allclose(t, want, rtol=1e-5, atol=1e-5)
            if not ok:
                bad.append(f"{impl} {size} B")
        buf = torch.zeros(count)
        samples: dict[str, list[float]] = {i: [] for i in impls}
        iters = _iters(size)
        for impl in impls:
            timed(calls[impl], buf, max(2, iters // 4))
        for r in range(args.rounds):
            order = impls[r % len(impls) :] + impls[: r % len(impls)]
            for impl in order:
                samples[impl].append(timed(calls[impl], buf, iters) * 1e6)
        us[str(size)] = {i: statistics.median(v) for i, v in samples.items()}
    for c in comms.values():
        c.finalize()
    mpi.Free()
    if bad:
        raise SystemExit(f"rank {rank}: wrong results: {', '.join(bad)}")
    if rank == 0:
        result = {"impls": impls, "sizes": sizes, "us": us, "note": note}
        print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
