"""The one table of compilable collectives: each ``TorchComm`` method and its op schemas.

Everything else (op definitions, kernels, fake kernels, method wrappers) is derived from it.
"""

from __future__ import annotations

import dataclasses

#: Library namespace of every op (``torch.ops.torchcomms.<name>``).
NAMESPACE = "torchcomms"

# Parameter kinds: how a value travels through the op schema.
TENSOR = "Tensor"
TENSORS = "Tensor[]"
INT = "int"
INTS = "int[]"
REDUCE_OP = "op"  # a ReduceOp, carried as ``str op, float? op_factor``

# Roles of a tensor parameter.
IN = "in"  # read only
INOUT = "inout"  # read and written in place (all_reduce's tensor)
OUT = "out"  # written only; its shape and dtype are the result's


@dataclasses.dataclass(frozen=True)
class Param:
    name: str
    kind: str
    role: str = IN


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


def _t(name: str, role: str = IN) -> Param:
    return Param(name, TENSOR, role)


def _ts(name: str, role: str = IN) -> Param:
    return Param(name, TENSORS, role)


_OP = Param("op", REDUCE_OP)

OPS: tuple[OpSpec, ...] = (
    OpSpec("send", (_t("tensor"), Param("dst", INT))),
    OpSpec("recv", (_t("tensor", OUT), Param("src", INT))),
    OpSpec("broadcast", (_t("tensor", INOUT), Param("root", INT))),
    OpSpec("all_reduce", (_t("tensor", INOUT), _OP)),
    OpSpec("reduce", (_t("tensor", INOUT), Param("root", INT), _OP)),
    OpSpec("all_gather", (_ts("tensor_list", OUT), _t("tensor"))),
    OpSpec("all_gather_v", (_ts("tensor_list", OUT), _t("tensor"))),
    OpSpec("all_gather_single", (_t("output", OUT), _t("input"))),
    OpSpec("reduce_scatter", (_t("output", OUT), _ts("input_list"), _OP)),
    OpSpec("reduce_scatter_v", (_t("output", OUT), _ts("input_list"), _OP)),
    OpSpec("reduce_scatter_single", (_t("output", OUT), _t("input"), _OP)),
    OpSpec("all_to_all", (_ts("output_tensor_list", OUT), _ts("input_tensor_list"))),
    OpSpec("all_to_all_single", (_t("output", OUT), _t("input"))),
    OpSpec(
        "all_to_all_v_single",
        (
            _t("output", OUT),
            _t("input"),
            Param("output_split_sizes", INTS),
            Param("input_split_sizes", INTS),
        ),
    ),
    OpSpec("barrier", ()),
    OpSpec("scatter", (_t("output_tensor", OUT), _ts("input_tensor_list"), Param("root", INT))),
    OpSpec("gather", (_ts("output_tensor_list", OUT), _t("input_tensor"), Param("root", INT))),
)

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
