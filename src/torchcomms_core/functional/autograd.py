"""Backward formulas of the functional ops (``torch.library.register_autograd``).

Each backward runs the adjoint collective synchronously on the same communicator:
all_reduce -> all_reduce of the grad; all_gather(_single) <-> reduce_scatter(_single)
(SUM); all_to_all(_single) -> all_to_all of the grads; all_to_all_v_single -> the same
with the split lists swapped; wait_tensors -> identity.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchcomms_core.functional.ops import op
from torchcomms_core.functional.table import NAMESPACE

_NO_X = (False, None, None)  # async_op, hints, timeout of a backward collective


def _grad(g: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(like) if g is None else g.contiguous()


def _save_inputs(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.inputs = inputs


def _all_reduce_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, tensor, name, factor, _a, hints, timeout = ctx.inputs
    g = op("torchcomm_all_reduce")(comm, _grad(grad, tensor), name, factor, False, hints, timeout)
    return (None, g, None, None, None, None, None)


def _all_gather_single_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, output, input, _a, hints, timeout = ctx.inputs
    g = op("torchcomm_reduce_scatter_single")(
        comm, torch.empty_like(input), _grad(grad, output), "SUM", None, False, hints, timeout
    )
    return (None, None, g, None, None, None)


def _reduce_scatter_single_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, output, input, _n, _f, _a, hints, timeout = ctx.inputs
    g = op("torchcomm_all_gather_single")(
        comm, torch.empty_like(input), _grad(grad, output), False, hints, timeout
    )
    return (None, None, g, None, None, None, None, None)


def _all_to_all_single_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, output, input, _a, hints, timeout = ctx.inputs
    g = op("torchcomm_all_to_all_single")(
        comm, torch.empty_like(input), _grad(grad, output), False, hints, timeout
    )
    return (None, None, g, None, None, None)


def _all_to_all_v_single_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, output, input, out_splits, in_splits, _a, hints, timeout = ctx.inputs
    g = op("torchcomm_all_to_all_v_single")(
        comm,
        torch.empty_like(input),
        _grad(grad, output),
        list(in_splits),
        list(out_splits),
        False,
        hints,
        timeout,
    )
    return (None, None, g, None, None, None, None, None)


def _all_gather_bwd(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[Any, ...]:
    comm, tensor_list, tensor, _a, hints, timeout = ctx.inputs
    gs = [_grad(g, t) for g, t in zip(grads, tensor_list, strict=True)]
    g = op("torchcomm_reduce_scatter")(
        comm, torch.empty_like(tensor), gs, "SUM", None, False, hints, timeout
    )
    return (None, [None] * len(tensor_list), g, None, None, None)


def _reduce_scatter_bwd(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    comm, output, input_list, _n, _f, _a, hints, timeout = ctx.inputs
    gs = op("torchcomm_all_gather")(
        comm, [torch.empty_like(t) for t in input_list], _grad(grad, output), False, hints, timeout
    )
    return (None, None, list(gs), None, None, None, None, None)


def _all_to_all_bwd(ctx: Any, grads: list[torch.Tensor | None]) -> tuple[Any, ...]:
    comm, output_list, input_list, _a, hints, timeout = ctx.inputs
    gs = [_grad(g, t) for g, t in zip(grads, output_list, strict=True)]
    gin = op("torchcomm_all_to_all")(
        comm, [torch.empty_like(t) for t in input_list], gs, False, hints, timeout
    )
    return (None, [None] * len(output_list), list(gin), None, None, None)


def _wait_bwd(ctx: Any, grads: list[torch.Tensor]) -> tuple[Any, ...]:
    return (list(grads),)


#: Functional op -> backward formula. Ops not listed are not differentiable.
FORMULAS: dict[str, Callable[..., tuple[Any, ...]]] = {
    "torchcomm_all_reduce": _all_reduce_bwd,
    "torchcomm_all_gather_single": _all_gather_single_bwd,
    "torchcomm_reduce_scatter_single": _reduce_scatter_single_bwd,
    "torchcomm_all_to_all_single": _all_to_all_single_bwd,
    "torchcomm_all_to_all_v_single": _all_to_all_v_single_bwd,
    "torchcomm_all_gather": _all_gather_bwd,
    "torchcomm_reduce_scatter": _reduce_scatter_bwd,
    "torchcomm_all_to_all": _all_to_all_bwd,
    "torchcomm_wait_tensors": _wait_bwd,
}

#: Methods whose result can carry a gradient.
DIFFERENTIABLE = frozenset(name.removeprefix("torchcomm_") for name in FORMULAS)


def register_formulas() -> None:
    """Attach every backward formula to its op (once per process)."""
    for name, backward in FORMULAS.items():
        torch.library.register_autograd(
            f"{NAMESPACE}::{name}", backward, setup_context=_save_inputs
        )
