"""``OpName`` and the per-operation argument objects that hooks receive.

An argument object is built only when a hook is registered, so the hot path pays nothing.
"""

from __future__ import annotations

import enum
from typing import Any


class OpName(str, enum.Enum):
    """Names of the operations a communicator runs (values equal the method names)."""

    send = "send"
    recv = "recv"
    broadcast = "broadcast"
    all_reduce = "all_reduce"
    reduce = "reduce"
    all_gather = "all_gather"
    all_gather_v = "all_gather_v"
    all_gather_single = "all_gather_single"
    reduce_scatter = "reduce_scatter"
    reduce_scatter_v = "reduce_scatter_v"
    reduce_scatter_single = "reduce_scatter_single"
    all_to_all_single = "all_to_all_single"
    all_to_all_v_single = "all_to_all_v_single"
    all_to_all = "all_to_all"
    barrier = "barrier"
    scatter = "scatter"
    gather = "gather"
    gather_single = "gather_single"
    split = "split"
    new_window = "new_window"
    finalize = "finalize"
    batch_op_issue = "batch_op_issue"

    def __str__(self) -> str:
        return self.value


class OpArgs:
    """Arguments of one operation as hooks see them; ``work`` is set before post hooks."""

    __slots__ = ("op_name", "op_id", "async_op", "timeout", "hints", "work", "_fields")

    fields: tuple[str, ...] = ()

    def __init__(self, op_name: str, op_id: int, values: tuple[Any, ...], async_op: bool,
                 timeout: Any, hints: Any) -> None:
        self.op_name = op_name
        self.op_id = op_id
        self.async_op = async_op
        self.timeout = timeout
        self.hints = hints
        self.work = None
        self._fields = dict(zip(self.fields, values, strict=False))

    def __getattr__(self, item: str) -> Any:
        try:
            return object.__getattribute__(self, "_fields")[item]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no argument {item!r}") from None

    def as_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self._fields.items())
        return f"{type(self).__name__}({inner}, async_op={self.async_op})"


def _short(value: Any) -> str:
    shape = getattr(value, "shape", None)
    if shape is not None:
        return f"Tensor{tuple(shape)}:{str(getattr(value, 'dtype', '')).replace('torch.', '')}"
    if isinstance(value, list) and len(value) > 4:
        return f"[{len(value)} items]"
    return repr(value)


#: Positional argument names of each operation, in the public API's order.
OP_FIELDS: dict[str, tuple[str, ...]] = {
    "send": ("tensor", "dst"),
    "recv": ("tensor", "src"),
    "broadcast": ("tensor", "root"),
    "all_reduce": ("tensor", "op"),
    "reduce": ("tensor", "root", "op"),
    "all_gather": ("tensor_list", "tensor"),
    "all_gather_v": ("tensor_list", "tensor"),
    "all_gather_single": ("output", "input"),
    "reduce_scatter": ("output", "input_list", "op"),
    "reduce_scatter_v": ("output", "input_list", "op"),
    "reduce_scatter_single": ("output", "input", "op"),
    "all_to_all": ("output_tensor_list", "input_tensor_list"),
    "all_to_all_single": ("output", "input"),
    "all_to_all_v_single": ("output", "input", "output_split_sizes", "input_split_sizes"),
    "barrier": (),
    "scatter": ("output_tensor", "input_tensor_list", "root"),
    "gather": ("output_tensor_list", "input_tensor", "root"),
    "gather_single": ("output", "input", "root"),
    "split": ("ranks", "name"),
    "new_window": (),
    "finalize": (),
    "batch_op_issue": ("ops",),
}


def _class_name(op: str) -> str:
    return "".join(part.capitalize() for part in op.split("_")) + "Args"


ARGS_CLASSES: dict[str, type[OpArgs]] = {
    op: type(_class_name(op), (OpArgs,), {"__slots__": (), "fields": fields})
    for op, fields in OP_FIELDS.items()
}


def args_class(op: str, fields: tuple[str, ...] = ()) -> type[OpArgs]:
    """Return (creating once) the argument class of ``op``; used for plugin collectives too."""
    cls = ARGS_CLASSES.get(op)
    if cls is None:
        cls = type(_class_name(op), (OpArgs,), {"__slots__": (), "fields": fields})
        ARGS_CLASSES[op] = cls
    return cls
