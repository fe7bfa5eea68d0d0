"""The cost of ``TORCHCOMM_CHECK_COLLECTIVES=1``: checked vs unchecked calls, same run.

Each rank holds two gloo communicators, one created with the check on and one without,
and times the same call on both, interleaved, so the ratio is read within one run:

    python benchmarks/check_collectives.py              # 2 ranks
    python benchmarks/check_collectives.py --nproc 4 --iters 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

SIZES = {"1 element": 1, "1 MiB": 1 << 18}


def _rank_body(iters: int) -> dict[str, tuple[float, float]]:
    import torchcomms
    from torchcomms_core.testing import unique_name

    plain = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("plain"))
    os.environ["TORCHCOMM_CHECK_COLLECTIVES"] = "1"
    try:
        checked = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("checked"))
    finally:
        del os.environ["TORCHCOMM_CHECK_COLLECTIVES"]
    rank, size = plain.get_rank(), plain.get_size()

    def all_reduce(comm, t):
        comm.all_reduce(t, torchcomms.ReduceOp.SUM)

    def ping_pong(comm, t):  # rank 0 <-> rank 1; other ranks idle
        if rank == 0:
            comm.send(t, 1)
            comm.recv(t, 1)
        elif rank == 1:
            comm.recv(t, 0)
            comm.send(t, 0)

    results: dict[str, tuple[float, float]] = {}
    for op, fn in (("all_reduce", all_reduce), ("send+recv", ping_pong)):
        for label, count in SIZES.items():
            t = torch.ones(count)
            times: dict[str, list[float]] = {"plain": [], "checked": []}
            for comm in (plain, checked):  # warm up both
                for _ in range(5):
                    fn(comm, t)
            for _ in range(iters):
                for key, comm in (("plain", plain), ("checked", checked)):
                    plain.barrier()
                    t0 = time.perf_counter()
                    fn(comm, t)
                    times[key].append(time.perf_counter() - t0)
            results[f"{op} {label}"] = (
                statistics.median(times["plain"]),
                statistics.median(times["checked"]),
            )
    plain.finalize()
    checked.finalize()
    del size
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args()
    from torchcomms_core.testing import RankPool

    with RankPool(args.nproc, comm_timeout_s=120) as pool:
        per_rank = pool.run(_rank_body, args.iters, timeout=600)
    rank0 = per_rank[0]
    print(
        f"TORCHCOMM_CHECK_COLLECTIVES cost, gloo, {args.nproc} ranks, median of "
        f"{args.iters} interleaved calls (rank 0)"
    )
    print(f"{'call':<24}{'unchecked (us)':>16}{'checked (us)':>16}{'ratio':>8}")
    for key, (plain_s, checked_s) in rank0.items():
        print(f"{key:<24}{plain_s * 1e6:>16.1f}{checked_s * 1e6:>16.1f}{checked_s / plain_s:>8.2f}")


if __name__ == "__main__":
    main()
