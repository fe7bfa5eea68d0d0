"""Reduction operators: ``ReduceOp`` values and their ``RedOpType``.

``ReduceOp.PREMUL_SUM(factor)`` carries a scalar or one-element tensor factor.
"""

from __future__ import annotations

import copy
import enum
from typing import Any, ClassVar, TypeAlias, cast

import torch

from torchcomms_core.foundation.errors import CommInputError, CommTypeError


class RedOpType(enum.Enum):
    """The kind of a reduction, without its parameters."""

    #: Element-wise sum (logical or for ``torch.bool``).
    SUM = 0
    #: Element-wise product (logical and for ``torch.bool``).
    PRODUCT = 1
    #: Element-wise minimum.
    MIN = 2
    #: Element-wise maximum.
    MAX = 3
    #: Bitwise and (integer and bool tensors only).
    BAND = 4
    #: Bitwise or (integer and bool tensors only).
    BOR = 5
    #: Bitwise exclusive or (integer and bool tensors only).
    BXOR = 6
    #: Each input multiplied by a factor, then summed (floating-point tensors, unless the
    #: backend runs it natively).
    PREMUL_SUM = 7
    #: The mean over the ranks, the sum divided by their number (floating-point tensors,
    #: unless the backend runs it natively).
    AVG = 8

    # Members are singletons: identity hashing is correct and, unlike Enum's Python-level
    # __hash__, costs nothing on the per-call path (set membership checks).
    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"RedOpType.{self.name}"


_BITWISE = frozenset({RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR})

# Inside ``ReduceOp`` the name ``RedOpType`` is the class attribute (the reference's
# ``ReduceOp.RedOpType``), not a type; annotations there use this alias instead.
_OpType: TypeAlias = RedOpType


class ReduceOp:
    """A reduction operator: ``ReduceOp.SUM`` ... or ``ReduceOp.PREMUL_SUM(factor)``.

    Instances compare equal to each other by type and factor, and to their
    :class:`RedOpType`. ``ReduceOp(opType, factor)`` builds one directly.

    Args:
        opType: the :class:`RedOpType` (the reference's keyword name).
        factor: ``PREMUL_SUM``'s factor, a number or a one-element tensor; no other type
            takes one.

    Raises:
        CommTypeError: ``opType`` is not a ``RedOpType``, or the factor is neither a number
            nor a tensor.
        CommInputError: ``PREMUL_SUM`` without a factor or with a tensor of more than one
            element, or a factor for another type.
    """

    __slots__ = ("_type", "_factor")

    #: Element-wise sum (:attr:`RedOpType.SUM`).
    SUM: ClassVar[ReduceOp]
    #: Element-wise product (:attr:`RedOpType.PRODUCT`).
    PRODUCT: ClassVar[ReduceOp]
    #: Element-wise minimum (:attr:`RedOpType.MIN`).
    MIN: ClassVar[ReduceOp]
    #: Element-wise maximum (:attr:`RedOpType.MAX`).
    MAX: ClassVar[ReduceOp]
    #: Bitwise and (:attr:`RedOpType.BAND`).
    BAND: ClassVar[ReduceOp]
    #: Bitwise or (:attr:`RedOpType.BOR`).
    BOR: ClassVar[ReduceOp]
    #: Bitwise exclusive or (:attr:`RedOpType.BXOR`).
    BXOR: ClassVar[ReduceOp]
    #: The mean over the ranks (:attr:`RedOpType.AVG`).
    AVG: ClassVar[ReduceOp]
    #: The reference's ``ReduceOp.RedOpType``: the :class:`RedOpType` enum itself.
    RedOpType: ClassVar[type[RedOpType]] = RedOpType

    def __init__(
        self,
        opType: _OpType,  # noqa: N803 (the reference's keyword)
        factor: float | torch.Tensor | None = None,
    ) -> None:
        op_type = opType
        if not isinstance(op_type, RedOpType):
            raise CommTypeError(f"ReduceOp(opType) needs a RedOpType, got {op_type!r}")
        if op_type is RedOpType.PREMUL_SUM:
            if factor is None:
                raise CommInputError("ReduceOp.PREMUL_SUM needs a factor: ReduceOp.PREMUL_SUM(0.5)")
            if isinstance(factor, torch.Tensor):
                if factor.numel() != 1:
                    raise CommInputError(
                        f"ReduceOp.PREMUL_SUM factor tensor must have one element, "
                        f"got shape {tuple(factor.shape)}"
                    )
            elif isinstance(factor, (int, float)) and not isinstance(factor, bool):
                factor = float(factor)
            else:
                raise CommTypeError(
                    f"ReduceOp.PREMUL_SUM factor must be a float or a one-element tensor, "
                    f"got {type(factor).__name__}"
                )
        elif factor is not None:
            raise CommInputError(f"ReduceOp.{op_type.name} takes no factor")
        self._type = op_type
        self._factor = factor

    @staticmethod
    def PREMUL_SUM(factor: float | torch.Tensor) -> ReduceOp:  # noqa: N802 (public API name)
        """Multiply each input by ``factor``, then sum.

        Raises:
            CommTypeError: ``factor`` is neither a number nor a tensor.
            CommInputError: ``factor`` is a tensor of more than one element.
        """
        return ReduceOp(RedOpType.PREMUL_SUM, factor)

    @property
    def type(self) -> _OpType:
        """The operator's :class:`RedOpType`."""
        return self._type

    @property
    def factor(self) -> float | torch.Tensor | None:
        """``PREMUL_SUM``'s factor (a float or a one-element tensor); ``None`` otherwise."""
        return self._factor

    @property
    def is_bitwise(self) -> bool:
        """Whether the operator is ``BAND``, ``BOR`` or ``BXOR``."""
        return self._type in _BITWISE

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RedOpType):
            return self._type is other
        if not isinstance(other, ReduceOp):
            return NotImplemented
        if self._type is not other._type:
            return False
        a, b = self._factor, other._factor
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and (a is b or bool(torch.equal(a, b)))
            )
        return a == b

    def __hash__(self) -> int:
        if isinstance(self._factor, torch.Tensor):
            return hash((self._type, id(self._factor)))
        return hash((self._type, self._factor))

    def __repr__(self) -> str:
        if self._type is RedOpType.PREMUL_SUM:
            return f"ReduceOp.PREMUL_SUM({self._factor!r})"
        return f"ReduceOp.{self._type.name}"

    def __copy__(self) -> ReduceOp:
        """A new operator of the same type and factor (the reference returns value copies)."""
        return ReduceOp(self._type, self._factor)

    def __deepcopy__(self, memo: dict[int, Any]) -> ReduceOp:
        """A new operator; a tensor factor is deep-copied through ``memo``, so objects
        copied together keep sharing it."""
        done = memo.get(id(self))
        if done is not None:
            return cast(ReduceOp, done)
        copied = ReduceOp(self._type, copy.deepcopy(self._factor, memo))
        memo[id(self)] = copied
        return copied

    def __reduce__(self) -> tuple[Any, ...]:
        return (ReduceOp, (self._type, self._factor))


for _t in RedOpType:
    if _t is not RedOpType.PREMUL_SUM:
        setattr(ReduceOp, _t.name, ReduceOp(_t))
del _t


def coerce_reduce_op(op: object, arg: str = "op") -> ReduceOp:
    """Accept our ``ReduceOp``, a ``RedOpType`` or a ``torch.distributed.ReduceOp``."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, RedOpType):
        if op is RedOpType.PREMUL_SUM:
            raise CommInputError(
                f"{arg}: use ReduceOp.PREMUL_SUM(factor), not RedOpType.PREMUL_SUM"
            )
        return cast(ReduceOp, getattr(ReduceOp, op.name))
    name = getattr(op, "name", None)  # c10d's RedOpType enum members have .name
    if isinstance(name, str) and name in RedOpType.__members__ and name != "PREMUL_SUM":
        return cast(ReduceOp, getattr(ReduceOp, name))
    c10d_type = getattr(op, "op", None)  # a c10d ReduceOp instance wraps a RedOpType
    name = getattr(c10d_type, "name", None)
    if isinstance(name, str) and name in RedOpType.__members__ and name != "PREMUL_SUM":
        return cast(ReduceOp, getattr(ReduceOp, name))
    raise CommTypeError(
        f"{arg} must be a torchcomms.ReduceOp such as ReduceOp.SUM, got {op!r} "
        f"({type(op).__name__})"
    )
