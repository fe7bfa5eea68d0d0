"""Where the time of a small mpi-backend call goes, layer by layer, in one run.

Per call, interleaved on the same 1-element tensor: raw blocking mpi4py
(``Allreduce``/``Bcast``), raw nonblocking mpi4py (``Iallreduce`` + ``Test`` loop, what the
backend issues for large ones), the backend's method called directly, the backend's entry
point for the core's lean lane (``lean_calls``) and ``TorchComm`` on mpi (the public
path); then, in the same processes, ``TorchComm`` on gloo in a loop of its own
(interleaving gloo's threads with MPI's busy polling on few cores would time the
scheduler). Medians of per-call times; the ratios to raw blocking are what matter.

    mpiexec -n 2 python benchmarks/mpi_overhead.py
    mpiexec -n 4 python benchmarks/mpi_overhead.py --calls 20000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10000, help="timed calls per variant")
    parser.add_argument("--elements", type=int, default=1, help="tensor size (elements)")
    args = parser.parse_args()

    from mpi4py import MPI

    import torchcomms
    from torchcomms import ReduceOp

    comm = torchcomms.new_comm("mpi", torch.device("cpu"), name="overhead")
    world = MPI.COMM_WORLD
    if world.Get_rank() == 0:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    else:
        port = 0
    # gloo in the same processes, rendezvousing through a store rank 0 hosts.
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(world.bcast(port, 0)))
    gloo = torchcomms.new_comm("gloo", torch.device("cpu"), name="overhead-gloo")
    backend = comm.get_backend_impl()
    raw = MPI.COMM_WORLD.Dup()
    t = torch.ones(args.elements)
    a = t.numpy()
    # all_to_all_single: this many elements per rank.
    u = torch.ones(args.elements * world.Get_size())
    u_out = torch.empty_like(u)
    b, b_out = u.numpy(), u_out.numpy()
    timeout = comm.get_timeout()
    # The backend's entry points for the core's lean lane (what TorchComm calls).
    lean = backend.lean_calls(timeout, {})
    test = MPI.Request.Test

    def nonblocking(start: Callable[[], object]) -> Callable[[], None]:
        def call() -> None:
            req = start()
            while not test(req):
                pass

        return call

    cases: dict[str, dict[str, Callable[[], object]]] = {
        "all_reduce": {
            "raw blocking": lambda: raw.Allreduce(MPI.IN_PLACE, a, MPI.SUM),
            "raw nonblocking": nonblocking(lambda: raw.Iallreduce(MPI.IN_PLACE, a, MPI.SUM)),
            "backend": lambda: backend.all_reduce(t, ReduceOp.SUM, False, timeout=timeout),
            "backend lean call": lambda: lean["all_reduce"](t, ReduceOp.SUM),
            "TorchComm": lambda: comm.all_reduce(t, ReduceOp.SUM, False),
            "TorchComm gloo": lambda: gloo.all_reduce(t, ReduceOp.SUM, False),
        },
        "broadcast": {
            "raw blocking": lambda: raw.Bcast(a, 0),
            "raw nonblocking": nonblocking(lambda: raw.Ibcast(a, 0)),
            "backend": lambda: backend.broadcast(t, 0, False, timeout=timeout),
            "backend lean call": lambda: lean["broadcast"](t, 0),
            "TorchComm": lambda: comm.broadcast(t, 0, False),
            "TorchComm gloo": lambda: gloo.broadcast(t, 0, False),
        },
        "all_to_all_single": {
            "raw blocking": lambda: raw.Alltoall(b, b_out),
            "raw nonblocking": nonblocking(lambda: raw.Ialltoall(b, b_out)),
            "backend": lambda: backend.all_to_all_single(u_out, u, False, timeout=timeout),
            "backend lean call": lambda: lean["all_to_all_single"](u_out, u),
            "TorchComm": lambda: comm.all_to_all_single(u_out, u, False),
            "TorchComm gloo": lambda: gloo.all_to_all_single(u_out, u, False),
        },
    }
    clock = time.perf_counter
    for op, variants in cases.items():
        separate = {"TorchComm gloo": variants.pop("TorchComm gloo")}
        times: dict[str, list[float]] = {name: [] for name in (*variants, *separate)}
        for group in (variants, separate):
            for _ in range(200):  # warm up
                for fn in group.values():
                    fn()
            raw.Barrier()
            for _ in range(args.calls):
                for name, fn in group.items():
                    t0 = clock()
                    fn()
                    times[name].append(clock() - t0)
        medians = {name: statistics.median(v) * 1e6 for name, v in times.items()}
        # The slowest rank's median bounds the operation.
        worst = {name: max(raw.allgather(m)) for name, m in medians.items()}
        if raw.Get_rank() == 0:
            base = worst["raw blocking"]
            print(
                f"# {op}, {raw.Get_size()} ranks, {args.elements} element(s), "
                f"{args.calls} calls each, interleaved; median us (ratio to raw blocking)"
            )
            for name, us in worst.items():
                print(f"{name:>16}: {us:8.2f} us  ({us / base:.2f})")
            print(f"{'gloo / mpi':>16}: {worst['TorchComm gloo'] / worst['TorchComm']:.1f}x")
    raw.Free()
    gloo.finalize()
    comm.finalize()


if __name__ == "__main__":
    main()
