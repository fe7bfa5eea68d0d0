"""Collectives the core ships as a plugin, registered through the same path as others.

``all_reduce_coalesced`` reduces several tensors in one engine call.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.operations.reduce_op import ReduceOp
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.hookspecs import hookimpl
from torchcomms_core.spec import TorchCommBackend, then, unflatten_into


def _all_reduce_coalesced(
    backend: TorchCommBackend,
    tensors: list[torch.Tensor],
    op: ReduceOp,
    async_op: bool,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
) -> Any:
    if not tensors:
        return None
    flat = torch.cat([t.reshape(-1) for t in tensors])
    work = backend.all_reduce(flat, op, async_op, timeout=timeout, hints=hints)
    return then(work, unflatten_into(flat, tensors))


def _validate_coalesced(
    comm: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    tensors, op = args
    checked = comm.checker.tensor_list("all_reduce_coalesced", "tensors", tensors)
    for i, t in enumerate(checked):
        comm.checker.same_dtype(
            "all_reduce_coalesced", f"tensors[{i}]", t, "tensors[0]", checked[0]
        )
    red = comm.checker.reduce_op(
        "all_reduce_coalesced", op, checked[0].dtype if checked else torch.float32
    )
    if checked and red.type not in comm.native_reduce_ops:
        raise comm_input_error(red)
    return (checked, red), kwargs


def comm_input_error(red: ReduceOp) -> Exception:
    from torchcomms_core.foundation.errors import CommInputError

    return CommInputError(
        f"all_reduce_coalesced: {red!r} is not native to this backend; "
        f"use all_reduce on each tensor"
    )


@hookimpl
def torchcomms_register_collectives() -> list[Collective]:
    return [
        Collective(
            name="all_reduce_coalesced",
            impl=_all_reduce_coalesced,
            args=("tensors", "op"),
            defaults={"op": ReduceOp.SUM},
            validate=_validate_coalesced,
            doc="all_reduce_coalesced(tensors, op=ReduceOp.SUM, async_op=False): reduce a "
            "list of tensors of one dtype in a single engine call.",
            bench="torchcomms_core.bench.ops:AllReduceCoalesced",
        )
    ]
