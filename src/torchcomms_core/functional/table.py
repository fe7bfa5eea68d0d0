"""The compilable operations and their ``torch.library`` schemas.

Derived from the core's operation table (``torchcomms_core.operations.table``): every operation
marked ``compilable`` gets op definitions, kernels, fake kernels and a method wrapper.
"""

from __future__ import annotations

import dataclasses

from torchcomms_core.operations.table import (
    IN,
    INOUT,
    INT,
    INTS,
    OUT,
    REDUCE_OP,
    TENSOR,
    TENSORS,
    Param,
)
from torchcomms_core.operations.table import OPS as _OPS

__all__ = [
    "IN",
    "INOUT",
    "INT",
    "INTS",
    "NAMESPACE",
    "OPS",
    "OUT",
    "REDUCE_OP",
    "TENSOR",
    "TENSORS",
    "BY_METHOD",
    "OpSpec",
    "Param",
    "schema",
]

#: Library namespace of every op (``torch.ops.torchcomms.<name>``).
NAMESPACE = "torchcomms"


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One ``TorchComm`` method that compiles.

    ``params`` are the method's parameters between ``self`` and ``async_op``. A spec with
    a written tensor gets an in-place op (``torchcomm_<method>_``) and a functional op
    (``torchcomm_<method>``) returning new tensors; one without (send, barrier) gets one
    op returning a token tensor that async waits key on.
    """

    method: str
    params: tuple[Param, ...]

    @property
    def written(self) -> Param | None:
        for p in self.params:
            if p.role != IN:
                return p
        return None

    @property
    def inplace_name(self) -> str:
        return f"torchcomm_{self.method}_"

    @property
    def functional_name(self) -> str:
        return f"torchcomm_{self.method}"


OPS: tuple[OpSpec, ...] = tuple(OpSpec(op.name, op.params) for op in _OPS if op.compilable)

BY_METHOD: dict[str, OpSpec] = {spec.method: spec for spec in OPS}


def schema(spec: OpSpec, ref_type: str, *, inplace: bool) -> str:
    """The ``torch.library`` schema of ``spec`` (without the op name)."""
    args = [f"{ref_type} comm"]
    for p in spec.params:
        if p.kind == REDUCE_OP:
            args += ["str op", "float? op_factor"]
        elif p.kind in (TENSOR, TENSORS) and p.role != IN and inplace:
            args.append(f"{p.kind.replace('Tensor', 'Tensor(a!)')} {p.name}")
        else:
            args.append(f"{p.kind} {p.name}")
    args += ["bool async_op", "Dict(str, str)? hints", "float? timeout"]
    written = spec.written
    if written is None:
        ret = "Tensor"
    elif inplace:
        # In-place ops return nothing: PT2 functionalizes a custom op's mutations only when
        # its outputs carry no alias annotation.
        ret = "()"
    else:
        ret = written.kind
    return f"({', '.join(args)}) -> {ret}"
