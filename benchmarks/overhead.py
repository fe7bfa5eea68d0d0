"""What torchcomms adds on top of its engine, measured against raw torch.distributed.

Three parts, all ratios taken within one run: collective time ours/c10d on the same
tensors (interleaved A/B), communicator creation and split vs init_process_group and
new_group, and the per-call Python cost of TorchComm dispatch against a do-nothing backend.

    python benchmarks/overhead.py                 # 2 and 4 ranks, the full set
    python benchmarks/overhead.py --nproc 2 --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from datetime import timedelta
from typing import Any

import torch

SIZES = {"1 element": 1, "64 MiB": 16 << 20}


def _quantiles(xs: list[float]) -> tuple[float, float, float]:
    qs = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return qs[0], statistics.median(xs), qs[2]


# -- multi-rank parts ----------------------------------------------------------------------


def _rank_collectives(iters_small: int, iters_large: int, out: str) -> int:
    import torch.distributed as dist
    from torch.distributed import ProcessGroupGloo

    import torchcomms
    from torchcomms_core.creation.bootstrap import default_store

    rank, size = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    store = default_store(rank, size, timedelta(seconds=300))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("c10d", store), rank=rank, world_size=size
    )
    comm = torchcomms.new_comm("gloo", "cpu", name="overhead")
    # A second raw gloo engine: ours/c10d can only be read against the spread between two
    # identical engines (raw/c10d), which is the measurement floor on this machine.
    raw = ProcessGroupGloo(dist.PrefixStore("control", store), rank, size, timedelta(seconds=300))
    calls = {
        "ours": lambda t: comm.all_reduce(t, torchcomms.ReduceOp.SUM),
        "c10d": lambda t: dist.all_reduce(t),
        "raw": lambda t: raw.allreduce([t]).wait(),
    }
    results: dict[str, Any] = {}
    for label, count in SIZES.items():
        iters = iters_small if count == 1 else iters_large
        t = torch.ones(count)
        for _ in range(max(3, iters // 20)):  # warm every path
            for call in calls.values():
                call(t)
        took: dict[str, list[float]] = {k: [] for k in calls}
        names = list(calls)
        for i in range(iters):
            # Rotate which goes first so drift and cache effects hit all equally.
            for who in names[i % 3 :] + names[: i % 3]:
                start = time.perf_counter()
                calls[who](t)
                took[who].append(time.perf_counter() - start)
        med = {k: statistics.median(v) for k, v in took.items()}
        ratios = [a / b for a, b in zip(took["ours"], took["c10d"], strict=True)]
        control = [a / b for a, b in zip(took["raw"], took["c10d"], strict=True)]
        results[label] = {
            "ours_us": med["ours"] * 1e6,
            "c10d_us": med["c10d"] * 1e6,
            "ratio_of_medians": med["ours"] / med["c10d"],
            "control_of_medians": med["raw"] / med["c10d"],
            "ratio_q": _quantiles(ratios),
            "control_q": _quantiles(control),
            "iters": iters,
        }
    comm.finalize()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


def _rank_init(reps: int, out: str) -> int:
    import torch.distributed as dist

    import torchcomms
    from torchcomms_core.creation.bootstrap import default_store

    rank, size = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    store = default_store(rank, size, timedelta(seconds=300))
    dist.init_process_group(
        "gloo", store=dist.PrefixStore("c10d", store), rank=rank, world_size=size
    )
    half = size // 2
    mine = list(range(half)) if rank < half else list(range(half, size))
    others = list(range(half, size)) if rank < half else list(range(half))
    create, split, ours_ms, c10d_ms = [], [], [], []
    keep: list[Any] = []  # destroying an engine joins its threads: keep that out of timing
    for i in range(reps + 1):  # round 0 warms imports and plugin loading, untimed
        dist.barrier()
        t0 = time.perf_counter()
        comm = torchcomms.new_comm("gloo", "cpu", name=f"init{i}")
        t1 = time.perf_counter()
        dist.barrier()
        t2 = time.perf_counter()
        group = dist.new_group(backend="gloo")
        t3 = time.perf_counter()
        dist.barrier()
        t4 = time.perf_counter()
        sub = comm.split(mine, f"half{i}")
        t5 = time.perf_counter()
        dist.barrier()
        # new_group is collective over all ranks: every rank creates both halves.
        t6 = time.perf_counter()
        groups = [dist.new_group(ranks=r, backend="gloo") for r in sorted((mine, others))]
        t7 = time.perf_counter()
        keep += [comm, sub, group, *groups]
        if i == 0:
            continue
        create.append((t1 - t0) / (t3 - t2))
        split.append((t5 - t4) / (t7 - t6))
        ours_ms.append((t1 - t0) * 1e3)
        c10d_ms.append((t3 - t2) * 1e3)
    for obj in keep:
        if isinstance(obj, torchcomms.TorchComm):
            obj.finalize()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "create": _quantiles(create),
                    "split": _quantiles(split),
                    "ours_ms": statistics.median(ours_ms),
                    "c10d_ms": statistics.median(c10d_ms),
                    "reps": reps,
                },
                f,
            )
    return 0


def _launch(nproc: int, target: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    from torchcomms_core.bench.launch import launch

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    code = launch(nproc, target, (*args, path), label="overhead")
    if code != 0:
        raise SystemExit(f"benchmark ranks failed (status {code})")
    with open(path) as f:
        return json.load(f)


# -- in-process part -----------------------------------------------------------------------


def per_call_cost(number: int) -> dict[str, float]:
    """Microseconds per call of TorchComm dispatch against a backend that does nothing."""
    from torch.distributed import HashStore

    import torchcomms
    from torchcomms import Collective, CommOptions, ReduceOp, TorchCommBackend, hookimpl
    from torchcomms_core.comm.operations import TorchComm

    class Nothing(TorchCommBackend):
        def init(self, device, name, options): ...
        def finalize(self): ...
        def get_rank(self):
            return 0

        def get_size(self):
            return 2

        def get_backend_name(self):
            return "nothing"

        def get_comm_name(self):
            return "nothing"

        def send(self, *args, **kwargs):
            return None

        def recv(self, *args, **kwargs):
            return None

        def all_reduce(self, tensor, op, async_op, *, timeout=None, hints=None):
            return None

        def noop_collective(self, tensor, op, async_op, *, timeout=None, hints=None):
            return None

    class Plugin:
        @hookimpl
        def torchcomms_register_collectives(self):
            return [
                Collective(name="noop_collective", impl=lambda *a, **k: None, args=("tensor", "op"))
            ]

    torchcomms.register_plugin(Plugin(), name="overhead-noop")
    try:
        backend = Nothing()
        opts = CommOptions(
            timeout=timedelta(seconds=5), store=HashStore(), name="x", rank=0, size=2
        )
        backend._bind(torch.device("cpu"), "x", opts)
        comm = TorchComm(backend, torch.device("cpu"), "x", opts, opts.store)
        t = torch.ones(1)
        sum_ = ReduceOp.SUM

        def best(fn: Any) -> float:
            return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6

        out = {
            "backend call alone": best(lambda: backend.all_reduce(t, sum_, False)),
            "TorchComm.all_reduce, no hooks": best(lambda: comm.all_reduce(t, sum_, False)),
            "TorchComm.all_reduce, async_op=True": best(lambda: comm.all_reduce(t, sum_, True)),
            "plugin collective (same shape), no hooks": best(
                lambda: comm.noop_collective(t, sum_, False)
            ),
        }
        handle = comm.register_pre_hook(lambda name, op_id, args: None)
        out["TorchComm.all_reduce, one pre hook"] = best(lambda: comm.all_reduce(t, sum_, False))
        handle.remove()
        return out
    finally:
        torchcomms.unregister_plugin("overhead-noop")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nproc", type=int, action="append", help="ranks (repeatable; default 2 and 4)"
    )
    parser.add_argument("--quick", action="store_true", help="few iterations (smoke run)")
    parser.add_argument(
        "--init-nproc",
        type=int,
        action="append",
        help="ranks for the creation/split part (default 2, 4, 8)",
    )
    args = parser.parse_args(argv)
    nprocs = args.nproc or [2, 4]
    init_nprocs = args.init_nproc or ([2] if args.quick else [2, 4, 8])
    small, large, reps = (200, 6, 3) if args.quick else (3000, 100, 9)

    print(
        f"# torchcomms overhead vs raw torch.distributed (gloo), torch {torch.__version__}, "
        f"{os.cpu_count()} cores"
    )
    print("\n## Collective time, ours / c10d (all_reduce SUM, same tensors, interleaved)\n")
    print(
        "Control: a second raw ProcessGroupGloo against the same c10d group, timed in the "
        "same rotation;\nits ratio is the floor below which no difference can be read.\n"
    )
    print(
        "| ranks | size | ours median (us) | c10d median (us) | ours/c10d (of medians) | "
        "ours/c10d paired median (IQR) | control raw/c10d (of medians) | iters |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in nprocs:
        res = _launch(n, _rank_collectives, (small, large))
        for label, r in res.items():
            q1, med, q3 = r["ratio_q"]
            print(
                f"| {n} | {label} | {r['ours_us']:.1f} | {r['c10d_us']:.1f} | "
                f"{r['ratio_of_medians']:.3f} | {med:.3f} ({q1:.3f}-{q3:.3f}) | "
                f"{r['control_of_medians']:.3f} | {r['iters']} |",
                flush=True,
            )

    print("\n## Creation and split, ours / c10d\n")
    print(
        "| ranks | new_comm (ms) | new_group (ms) | new_comm / new_group (median, IQR) | "
        "split halves / new_group x2 (median, IQR) | reps |"
    )
    print("|---|---|---|---|---|---|")
    for n in init_nprocs:
        res = _launch(n, _rank_init, (reps,))
        c, s = res["create"], res["split"]
        print(
            f"| {n} | {res['ours_ms']:.2f} | {res['c10d_ms']:.2f} | {c[1]:.3f} "
            f"({c[0]:.3f}-{c[2]:.3f}) | {s[1]:.3f} ({s[0]:.3f}-{s[2]:.3f}) | {res['reps']} |",
            flush=True,
        )

    print("\n## Per-call Python cost (in-process, do-nothing backend)\n")
    print("| call | us per call |")
    print("|---|---|")
    for label, us in per_call_cost(20000 if args.quick else 100000).items():
        print(f"| {label} | {us:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
