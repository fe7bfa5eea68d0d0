"""The one table of operations a communicator runs.

Each row names an operation, its number in the reference's ``OpName``, its parameters
(in the public method's order, with their kind, role and reference hook field) and what
the rest of the core needs to know about it. Everything that lists operations derives
from this table:

- the communicator's methods (``comm.face``, written from the table by
  ``scripts/gen_face.py``: signature, docstring, lean opening and the form that prepares
  the call) and ``OpName`` (``operations.names``, written by the same script);
- the hook argument classes (``operations.args``), the spec's derivable and forwarding
  methods (``spec``), the backend calling convention, the cross-rank call check
  (``comm.consistency``) and the compiled ops (``functional.table``);
- the bridge's, the bench's and the call log's lists of operations.

Adding an operation to the core means its row here, its portable default in
``spec.defaults`` (or ``support=REQUIRED``/``OPTIONAL``), its form in ``comm.forms`` when
no existing form fits, and rerunning ``scripts/gen_face.py``.
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
    #: The function of ``comm.forms`` that checks and stages the call's arguments; the
    #: communicator's method is generated from the row ("": written by hand).
    form: str = ""
    #: The method opens with the lean lane (``comm.lean``) for plain synchronous calls.
    lean: bool = False
    #: The operation with equal blocks that this one generalises to uneven ones; the
    #: portable default of that one forwards here (``spec.defaults.FORWARDING_DEFAULTS``).
    uneven_of: str = ""
    #: The method's docstring.
    doc: str = ""
    #: Where users call it ("": ``TorchComm.<name>``).
    method: str = ""

    @property
    def where(self) -> str:
        """The method users call, ``TorchComm.<name>`` unless the row says otherwise."""
        return self.method or f"TorchComm.{self.name}"

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

_RED_DOC = (
    "``op`` is a :class:`ReduceOp`; AVG and PREMUL_SUM need a floating-point tensor and "
    "bitwise ops an integer or bool one (:class:`CommInputError` otherwise)."
)

OPS: tuple[Op, ...] = (
    Op(
        "send",
        0,
        (_t("tensor"), Param("dst", INT, hook="peer")),
        REQUIRED,
        p2p=True,
        form="to_peer",
        doc="Send ``tensor`` to rank ``dst``; the peer posts a matching :meth:`recv`.",
    ),
    Op(
        "recv",
        1,
        (_t("tensor", OUT), Param("src", INT, hook="peer")),
        REQUIRED,
        p2p=True,
        form="from_peer",
        doc="Receive into ``tensor`` from rank ``src`` (same element count and dtype as sent).",
    ),
    Op(
        "broadcast",
        2,
        (_t("tensor", INOUT), _ROOT),
        uniform=True,
        form="from_root",
        lean=True,
        doc="Copy rank ``root``'s ``tensor`` into ``tensor`` on every rank.",
    ),
    Op(
        "all_reduce",
        3,
        (_t("tensor", INOUT), _OP),
        uniform=True,
        form="reduce_in_place",
        lean=True,
        doc="Reduce ``tensor`` over every rank with ``op``; each rank gets the result in "
        "place.\n\n" + _RED_DOC,
    ),
    Op(
        "reduce",
        4,
        (_t("tensor", INOUT), _ROOT, _OP),
        uniform=True,
        form="reduce_to_root",
        doc="Reduce ``tensor`` over every rank with ``op`` into ``tensor`` on rank ``root``."
        "\n\nOther ranks' tensors are left unchanged. ``op`` as for :meth:`all_reduce`.",
    ),
    Op(
        "all_gather",
        5,
        (_ts("tensor_list", OUT, "output"), _t("tensor", hook="input")),
        uniform=True,
        form="gather_lists",
        doc="Gather every rank's ``tensor`` into ``tensor_list`` (one same-sized entry per rank).",
    ),
    Op(
        "all_gather_v",
        6,
        (_ts("tensor_list", OUT, "output"), _t("tensor", hook="input")),
        form="gather_lists",
        uneven_of="all_gather",
        doc=":meth:`all_gather` where ranks contribute tensors of different sizes.\n\n"
        "``tensor_list[r]`` is sized for rank ``r``'s ``tensor``.",
    ),
    Op(
        "all_gather_single",
        7,
        (_OUT, _IN),
        uniform=True,
        form="gather_one",
        lean=True,
        doc="Gather every rank's ``input`` into ``output`` (size x input's elements, rank order).",
    ),
    Op(
        "reduce_scatter",
        8,
        (_OUT, _ts("input_list", hook="input"), _OP),
        uniform=True,
        form="reduce_lists",
        doc="Reduce ``input_list[r]`` over every rank with ``op`` into rank ``r``'s ``output``.",
    ),
    Op(
        "reduce_scatter_v",
        9,
        (_OUT, _ts("input_list", hook="input"), _OP),
        form="reduce_lists",
        uneven_of="reduce_scatter",
        doc=":meth:`reduce_scatter` with per-rank block sizes (``input_list[r]`` fits rank r).",
    ),
    Op(
        "reduce_scatter_single",
        10,
        (_OUT, _IN, _OP),
        uniform=True,
        form="reduce_one",
        doc=":meth:`reduce_scatter` from one ``input`` of size x output's elements (rank order).",
    ),
    Op(
        "all_to_all_single",
        11,
        (_OUT, _IN),
        uniform=True,
        form="exchange_even",
        lean=True,
        doc="Split ``input`` along dim 0 into size equal blocks; block r goes to rank r.\n\n"
        "``output`` receives rank r's block at position r. Raises :class:`CommInputError` "
        "when dim 0 is not divisible by the size (use :meth:`all_to_all_v_single`).",
    ),
    Op(
        "all_to_all_v_single",
        12,
        (_OUT, _IN, Param("output_split_sizes", INTS), Param("input_split_sizes", INTS)),
        form="exchange_split",
        uneven_of="all_to_all_single",
        doc=":meth:`all_to_all_single` with explicit block sizes (rows of dim 0 per rank)."
        "\n\nAn empty list splits evenly; sizes must sum to the tensor's dim 0.",
    ),
    Op(
        "all_to_all",
        13,
        (_ts("output_tensor_list", OUT, "output"), _ts("input_tensor_list", hook="input")),
        form="exchange_lists",
        doc="Send ``input_tensor_list[r]`` to rank r; get its block in "
        "``output_tensor_list[r]``.\n\nBlocks may differ in size between ranks; all share "
        "one dtype.",
    ),
    Op(
        "barrier",
        14,
        form="no_tensors",
        lean=True,
        doc="Complete once every rank has called ``barrier``.",
    ),
    Op(
        "scatter",
        15,
        (_t("output_tensor", OUT, "output"), _ts("input_tensor_list", hook="input"), _ROOT),
        form="scatter_from_root",
        doc="Send root's ``input_tensor_list[r]`` to rank r's ``output_tensor``.\n\n"
        "Only ``root`` reads ``input_tensor_list`` (others may pass ``[]``).",
    ),
    Op(
        "gather",
        16,
        (_ts("output_tensor_list", OUT, "output"), _t("input_tensor", hook="input"), _ROOT),
        form="gather_lists_to_root",
        doc="Gather every rank's ``input_tensor`` into root's ``output_tensor_list``.\n\n"
        "Only ``root`` writes ``output_tensor_list`` (others may pass ``[]``).",
    ),
    Op(
        "gather_single",
        17,
        (_OUT, _IN, _ROOT),
        compilable=False,
        form="gather_one_to_root",
        doc="Gather every rank's ``input`` into root's ``output`` (size x input's elements).",
    ),
    Op("split", 18, (Param("ranks", OTHER), Param("name", OTHER)), issued=False, compilable=False),
    Op("new_window", 19, (), OPTIONAL, issued=False, compilable=False),
    # The reference numbers BatchSendRecv.issue without binding the name.
    Op(
        "batch_op_issue",
        20,
        (Param("ops", OTHER),),
        p2p=True,
        compilable=False,
        method="BatchSendRecv.issue",
    ),
    Op("finalize", 21, (), REQUIRED, issued=False, compilable=False),
)

BY_NAME: dict[str, Op] = {op.name: op for op in OPS}


def names(**where: object) -> tuple[str, ...]:
    """Names of the operations whose attributes equal ``where`` (``names(p2p=True)``)."""
    return tuple(
        op.name for op in OPS if all(getattr(op, key) == value for key, value in where.items())
    )


def forwarding() -> dict[str, str]:
    """Each operation with equal blocks -> the uneven one it generalises to."""
    return {op.uneven_of: op.name for op in OPS if op.uneven_of}


def uneven_lists() -> frozenset[str]:
    """The uneven forms of the list collectives: blocks of different sizes in lists of
    tensors, which engines with equal-block list collectives (c10d's) cannot run."""
    return frozenset(
        op.name for op in OPS if op.uneven_of and any(p.kind == TENSORS for p in op.params)
    )


def lists(hook_field: str) -> frozenset[str]:
    """The operations whose ``hook_field`` (``"input"`` or ``"output"``) is a tensor list."""
    return frozenset(
        op.name
        for op in OPS
        if any(p.kind == TENSORS and p.hook_field == hook_field for p in op.params)
    )
