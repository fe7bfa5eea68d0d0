"""A data-parallel training step compiled whole: forward, backward, gradient all_reduce.

    torchrun --standalone --nproc-per-node 2 examples/compiled_training.py

``TORCHCOMMS_PATCH_FOR_COMPILE=1`` (set below before ``import torchcomms``) makes the
communicator's collectives ``torch.library`` ops, so ``torch.compile(fullgraph=True)``
captures the whole step in one graph. The same step runs eagerly from the same start;
both loss traces are printed and must agree, and must match one process training on the
whole batch.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHCOMMS_PATCH_FOR_COMPILE", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.func import functional_call, grad_and_value  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _training import GLOBAL_BATCH, LR, batches, make_model, reference  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms import ReduceOp  # noqa: E402


def make_step(comm: Any, model: nn.Module) -> Callable[..., torch.Tensor]:
    """One SGD step on this rank's slice; returns the loss averaged over ranks."""

    def loss_fn(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(functional_call(model, params, (x,)), y)

    def step(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grads, loss = grad_and_value(loss_fn)(params, x, y)
        for g in grads.values():
            comm.all_reduce(g, ReduceOp.AVG, False)
        with torch.no_grad():
            for name, p in params.items():
                p.sub_(LR * grads[name])
        comm.all_reduce(loss, ReduceOp.AVG, False)
        return loss

    return step


def train(comm: Any, steps: int, compiled: bool) -> tuple[list[float], float, float]:
    """Train from the shared start; return (losses, first-step seconds, later-step mean)."""
    rank, size = comm.get_rank(), comm.get_size()
    model = make_model()
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    step = make_step(comm, model)
    if compiled:
        step = torch.compile(step, fullgraph=True)
    per = GLOBAL_BATCH // size
    losses, times = [], []
    for x, y in batches(steps):
        xs, ys = x[rank * per : (rank + 1) * per], y[rank * per : (rank + 1) * per]
        comm.barrier(False)
        start = time.perf_counter()
        loss = step(params, xs, ys)
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    later = times[1:] or times
    return losses, times[0], sum(later) / len(later)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    if not torchcomms.is_torch_compile_supported_and_enabled():
        raise SystemExit("this example needs TORCHCOMMS_PATCH_FOR_COMPILE=1 and PyTorch >= 2.12")
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="compiled_training")
    rank = comm.get_rank()
    eager, _, eager_step = train(comm, args.steps, compiled=False)
    compiled, first, compiled_step = train(comm, args.steps, compiled=True)
    ref = reference(args.steps)
    worst = max(abs(c - e) / max(abs(e), 1e-12) for c, e in zip(compiled, eager, strict=True))
    worst_ref = max(abs(c - r) / max(abs(r), 1e-12) for c, r in zip(compiled, ref, strict=True))
    if rank == 0:
        for i, (e, c) in enumerate(zip(eager, compiled, strict=True)):
            print(f"step {i} eager {e:.8f} compiled {c:.8f} reference {ref[i]:.8f}", flush=True)
        print(f"compiled vs eager worst rel.diff {worst:.2e}; vs one process {worst_ref:.2e}")
        print(
            f"first compiled step (compile + run) {first:.1f} s; step time eager "
            f"{eager_step * 1e3:.2f} ms, compiled {compiled_step * 1e3:.2f} ms"
        )
    comm.finalize()
    ok = worst <= 1e-6 and worst_ref <= 1e-5
    if rank == 0:
        print(f"compiled training matches eager: {ok}", flush=True)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
