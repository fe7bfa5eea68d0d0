"""Step time of the compiled data-parallel training step against the same step run eagerly.

The step is ``examples/compiled_training.py``'s: forward, backward and the gradient
all_reduce through a torchcomms communicator, compiled with ``fullgraph=True`` (inductor)
or run eagerly. Rounds of eager and compiled steps alternate on the same ranks, so the
ratio is taken within one run; the first compiled call, with an empty inductor cache, is
reported as the compile time.

    python benchmarks/compiled_step.py                  # 2 gloo ranks
    python benchmarks/compiled_step.py --nproc 4 --rounds 8 --json step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")


def _rank_body(steps: int, rounds: int) -> dict[str, Any]:
    import torch

    import torchcomms
    import torchcomms_core.functional.collectives  # noqa: F401 - the compile path

    # One thread per rank, as torchrun sets it: the pool's ranks imported torch before
    # their OMP_NUM_THREADS applied, and oversubscribed OpenMP kernels measure the machine.
    torch.set_num_threads(1)

    sys.path.insert(0, EXAMPLES)
    from _training import GLOBAL_BATCH, make_model
    from compiled_training import make_step

    from torchcomms_core.testing import unique_name

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("compiled_step"))
    rank, size = comm.get_rank(), comm.get_size()
    model = make_model()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    per = GLOBAL_BATCH // size
    gen = torch.Generator().manual_seed(rank)
    x, y = torch.randn(per, 32, generator=gen), torch.randn(per, 8, generator=gen)
    eager = make_step(comm, model)
    compiled = torch.compile(make_step(comm, model), fullgraph=True)

    comm.barrier(False)
    start = time.perf_counter()
    compiled(params, x, y)
    first_call = time.perf_counter() - start

    def timed(step: Any) -> list[float]:
        comm.barrier(False)
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step(params, x, y)
            out.append(time.perf_counter() - t0)
        return out

    timed(eager)  # warm-up of the eager path
    eager_s: list[float] = []
    compiled_s: list[float] = []
    for _ in range(rounds):
        eager_s += timed(eager)
        compiled_s += timed(compiled)
    comm.finalize()
    return {"first_call_s": first_call, "eager_s": eager_s, "compiled_s": compiled_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2, help="local gloo ranks (2)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round (20)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (5)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    args = parser.parse_args()
    if args.nproc < 2 or args.steps < 1 or args.rounds < 1:
        parser.error("--nproc must be >= 2; --steps and --rounds must be >= 1")

    from torchcomms_core.testing import RankPool

    cache = tempfile.mkdtemp(prefix="torchcomms-inductor-")
    env = {
        "TORCHCOMMS_PATCH_FOR_COMPILE": "1",
        "TORCHINDUCTOR_CACHE_DIR": cache,
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    with RankPool(args.nproc, env=env, comm_timeout_s=600) as pool:
        results = pool.run(_rank_body, args.steps, args.rounds, timeout=1800)
    # A step ends when the slowest rank's does: take the per-step maximum over ranks.
    eager = [max(r["eager_s"][i] for r in results) for i in range(len(results[0]["eager_s"]))]
    compiled = [
        max(r["compiled_s"][i] for r in results) for i in range(len(results[0]["compiled_s"]))
    ]
    e_med, c_med = statistics.median(eager), statistics.median(compiled)
    first = max(r["first_call_s"] for r in results)
    figures = {
        "ranks": args.nproc,
        "steps": len(eager),
        "eager_step_ms": e_med * 1e3,
        "compiled_step_ms": c_med * 1e3,
        "compiled_over_eager": c_med / e_med,
        "compile_s": first - c_med,
    }
    print(
        f"{'ranks':>5} {'steps':>6} {'eager ms':>9} {'compiled ms':>12} {'ratio':>6} "
        f"{'compile s':>10}"
    )
    print(
        f"{args.nproc:>5} {len(eager):>6} {e_med * 1e3:>9.2f} {c_med * 1e3:>12.2f} "
        f"{c_med / e_med:>6.2f} {first - c_med:>10.1f}"
    )
    print(
        "(median step time, slowest rank per step; ratio = compiled / eager; compile = "
        "first compiled call with an empty inductor cache, less one step)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()
