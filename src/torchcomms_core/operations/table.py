"""The one table of operations a communicator runs.

Each row names an operation, its number in the reference's ``OpName``, its parameters
(in the public method's order, with their kind, role and reference hook field) and what
the rest of the core needs to know about it. Everything that lists operations derives
from this table: ``OpName`` and the hook argument classes (``_op_args``), the spec's
derivable methods (``spec``), the backend calling convention (``_calling``), the
cross-rank call check (``_consistency``) and the compiled ops (``functional.table``).
"""

from __future__ import annotations

import dataclasses

# Parameter kinds: how a value travels (also the torch.library schema type of compiled ops).
TENSOR = "Tensor"
TENSORS = "Tensor[]"
INT = "int"
INTS = "int[]"
REDUCE_OP = "op"  # a ReduceOp; compiled ops carry it as ``str op, float? op_factor``
OTHER = "other"  # a name, a list of P2POps: never part of a compiled op

# Roles of a tensor parameter.
IN = "in"  # read only
INOUT = "inout"  # read and written in place (all_reduce's tensor)
OUT = "out"  # written only; its shape and dtype are the result's

# How a backend provides an operation (``spec.method_support`` reports it).
REQUIRED = "required"  # every backend implements it
DERIVED = "derived"  # the spec has a portable default written against send/recv
OPTIONAL = "optional"  # a capability a backend may lack


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter of an operation."""

    name: str
    kind: str
    role: str = IN
    #: The field name the reference's hook argument objects use for it ("" = same name).
    hook: str = ""

    @property
    def hook_field(self) -> str:
        return self.hook or self.name


@dataclasses.dataclass(frozen=True)
class Op:
    """One row of the table."""

    name: str
    #: The value of ``OpName.<name>`` (the reference's numbering).
    number: int
    params: tuple[Param, ...] = ()
    support: str = DERIVED
    #: Issued through ``TorchComm._issue``: takes ``async_op``/``timeout``/``hints`` and
    #: returns a work.
    issued: bool = True
    #: Point to point: the cross-rank check pairs it with its peer's call.
    p2p: bool = False
    #: Its first tensor has the same element count on every rank.
    uniform: bool = False
    #: Has a ``torch.ops.torchcomms`` op (traceable by torch.compile).
    compilable: bool = True

    @property
    def fields(self) -> tuple[str, ...]:
        """Parameter names in the public method's order."""
        return tuple(p.name for p in self.params)

    @property
    def hook_fields(self) -> dict[str, str]:
        """The reference's hook field -> the parameter it reads."""
        return {p.hook_field: p.name for p in self.params}


def _t(name: str, role: str = IN, hook: str = "") -> Param:
    return Param(name, TENSOR, role, hook)


def _ts(name: str, role: str = IN, hook: str = "") -> Param:
    return Param(name, TENSORS, role, hook)


_OP = Param("op", REDUCE_OP)
_ROOT = Param("root", INT)
_IN, _OUT = _t("input"), _t("output", OUT)

OPS: tuple[Op, ...] = (
    Op("send", 0, (_t("tensor"), Param("dst", INT, hook="peer")), REQUIRED, p2p=True),
    Op("recv", 1, (_t("tensor", OUT), Param("src", INT, hook="peer")), REQUIRED, p2p=True),
    Op("broadcast", 2, (_t("tensor", INOUT), _ROOT), uniform=True),
    Op("all_reduce", 3, (_t("tensor", INOUT), _OP), uniform=True),
    Op("reduce", 4, (_t("tensor", INOUT), _ROOT, _OP), uniform=True),
    Op(
        "all_gather",
        5,
        (_ts("tensor_list", OUT, "output"), _t("tensor", hook="input")),
        uniform=True,
    ),
    Op("all_gather_v", 6, (_ts("tensor_list", OUT, "output"), _t("tensor", hook="input"))),
    Op("all_gather_single", 7, (_OUT, _IN), uniform=True),
    Op("reduce_scatter", 8, (_OUT, _ts("input_list", hook="input"), _OP), uniform=True),
    Op("reduce_scatter_v", 9, (_OUT, _ts("input_list", hook="input"), _OP)),
    Op("reduce_scatter_single", 10, (_OUT, _IN, _OP), uniform=True),
    Op("all_to_all_single", 11, (_OUT, _IN), uniform=True),
    Op(
        "all_to_all_v_single",
        12,
        (_OUT, _IN, Param("output_split_sizes", INTS), Param("input_split_sizes", INTS)),
    ),
    Op(
        "all_to_all",
        13,
        (_ts("output_tensor_list", OUT, "output"), _ts("input_tensor_list", hook="input")),
    ),
    Op("barrier", 14),
    Op(
        "scatter",
        15,
        (_t("output_tensor", OUT, "output"), _ts("input_tensor_list", hook="input"), _ROOT),
    ),
    Op(
        "gather",
        16,
        (_ts("output_tensor_list", OUT, "output"), _t("input_tensor", hook="input"), _ROOT),
    ),
    Op("gather_single", 17, (_OUT, _IN, _ROOT), compilable=False),
    Op("split", 18, (Param("ranks", OTHER), Param("name", OTHER)), issued=False, compilable=False),
    Op("new_window", 19, (), OPTIONAL, issued=False, compilable=False),
    # BatchSendRecv.issue; the reference numbers it without binding the name.
    Op("batch_op_issue", 20, (Param("ops", OTHER),), p2p=True, compilable=False),
    Op("finalize", 21, (), REQUIRED, issued=False, compilable=False),
)

BY_NAME: dict[str, Op] = {op.name: op for op in OPS}


def names(**where: object) -> tuple[str, ...]:
    """Names of the operations whose attributes equal ``where`` (``names(p2p=True)``)."""
    return tuple(
        op.name for op in OPS if all(getattr(op, key) == value for key, value in where.items())
    )
