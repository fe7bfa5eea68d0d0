"""The ``torchcomms`` custom ops: definitions, kernels, fake kernels and effects.

Each op takes a :class:`CommRef` (an opaque reference type: a graph input, never baked
into a compiled graph) and runs the unpatched ``TorchComm`` method. Async ops leave
their work in :mod:`.pending`, keyed by the written tensors; the wait ops collect it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import torch
from torch._library.effects import EffectType
from torch._library.opaque_object import MemberType, register_opaque_type
from torch._opaque_base import OpaqueBase

from torchcomms_core.foundation.errors import CommStateError
from torchcomms_core.functional import pending
from torchcomms_core.functional.table import (
    INOUT,
    NAMESPACE,
    OPS,
    REDUCE_OP,
    TENSORS,
    OpSpec,
    schema,
)
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp

if TYPE_CHECKING:
    from torchcomms_core.comm.operations import TorchComm


class CommRef(OpaqueBase):
    """The handle a compiled graph holds for a ``TorchComm`` (one per communicator).

    Registered as an opaque *reference* type, so a graph takes it as an input and works
    with any communicator; the listed members are read at compile time. It holds the
    communicator weakly so graphs and caches never keep one alive.
    """

    def __init__(self, comm: TorchComm) -> None:
        self._comm = weakref.ref(comm)
        self._rank = comm.get_rank()
        self._size = comm.get_size()
        self._name = comm.get_name()

    @property
    def comm(self) -> TorchComm:
        comm = self._comm()
        if comm is None:
            raise CommStateError(
                f"communicator {self._name!r} no longer exists; a compiled function that "
                f"uses it must be called with a live communicator"
            )
        return comm

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_name(self) -> str:
        return self._name

    def __repr__(self) -> str:
        return f"<CommRef {self._name!r} rank={self._rank}/{self._size}>"


register_opaque_type(
    CommRef,
    typ="reference",
    members={
        "get_rank": MemberType.USE_REAL,
        "get_size": MemberType.USE_REAL,
        "get_name": MemberType.USE_REAL,
    },
)
REF_TYPE = f"{CommRef.__module__}.{CommRef.__qualname__}"

#: Methods of ``TorchComm`` as they were before the compile path wrapped them.
ORIGINALS: dict[str, Callable[..., Any]] = {}

_lib: torch.library.Library | None = None


def reduce_op_fields(op: ReduceOp) -> tuple[str, float | None]:
    """A ``ReduceOp`` as the schema carries it: its type name and PREMUL_SUM factor."""
    factor = op.factor
    if isinstance(factor, torch.Tensor):
        factor = float(factor.item())
    return op.type.name, factor


def _reduce_op(name: str, factor: float | None) -> ReduceOp:
    if factor is not None:
        return ReduceOp.PREMUL_SUM(factor)
    return cast(ReduceOp, getattr(ReduceOp, RedOpType[name].name))


def _call_kwargs(hints: dict[str, str] | None, timeout: float | None) -> dict[str, Any]:
    kwargs: dict[str, Any] = {}
    if hints is not None:
        kwargs["hints"] = dict(hints)
    if timeout is not None:
        kwargs["timeout"] = timedelta(seconds=timeout)
    return kwargs


def _written_tensors(spec: OpSpec, values: list[Any]) -> list[torch.Tensor]:
    written = spec.written
    if written is None:
        return []
    value = values[spec.params.index(written)]
    return list(value) if written.kind == TENSORS else [value]


def _method_args(spec: OpSpec, values: list[Any]) -> list[Any]:
    """Schema values (``op``, ``op_factor`` split) back into the method's arguments."""
    out: list[Any] = []
    i = 0
    for p in spec.params:
        if p.kind == REDUCE_OP:
            out.append(_reduce_op(values[i], values[i + 1]))
            i += 2
        else:
            out.append(values[i])
            i += 1
    return out


def _run(
    spec: OpSpec,
    ref: CommRef,
    values: list[Any],
    async_op: bool,
    hints: dict[str, str] | None,
    timeout: float | None,
    keys: list[torch.Tensor],
) -> None:
    method = ORIGINALS[spec.method]
    work = method(ref.comm, *values, async_op, **_call_kwargs(hints, timeout))
    if async_op:
        pending.put(keys, work)


def _fresh(
    spec: OpSpec, values: list[Any], like: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[list[Any], Any]:
    """Replace the written parameter with new tensors; return (values, the new tensors)."""
    written = spec.written
    assert written is not None
    idx = spec.params.index(written)
    old = values[idx]
    if written.kind == TENSORS:
        new: Any = [like(t) if written.role == INOUT else torch.empty_like(t) for t in old]
    else:
        new = like(old) if written.role == INOUT else torch.empty_like(old)
    values = list(values)
    values[idx] = new
    return values, new


def _kernels(spec: OpSpec) -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """``{op name: (kernel, fake kernel)}`` for one spec."""
    n_schema = sum(2 if p.kind == REDUCE_OP else 1 for p in spec.params)

    def split(args: tuple[Any, ...]) -> tuple[CommRef, list[Any], bool, Any, Any]:
        ref, rest = args[0], list(args[1:])
        schema_vals = rest[:n_schema]
        async_op, hints, timeout = rest[n_schema : n_schema + 3]
        return ref, schema_vals, async_op, hints, timeout

    def method_values(schema_vals: list[Any]) -> list[Any]:
        return _method_args(spec, schema_vals)

    written = spec.written
    if written is None:

        def token_kernel(*args: Any) -> torch.Tensor:
            ref, vals, async_op, hints, timeout = split(args)
            token = torch.zeros(1, dtype=torch.uint8)
            _run(spec, ref, method_values(vals), async_op, hints, timeout, [token])
            return token

        def token_fake(*args: Any) -> torch.Tensor:
            return torch.empty(1, dtype=torch.uint8)

        return {spec.functional_name: (token_kernel, token_fake)}

    widx = spec.params.index(written)
    # Position of the written parameter among the schema values (op expands to two).
    wpos = sum(2 if p.kind == REDUCE_OP else 1 for p in spec.params[:widx])

    def inplace_kernel(*args: Any) -> None:
        ref, vals, async_op, hints, timeout = split(args)
        mvals = method_values(vals)
        _run(spec, ref, mvals, async_op, hints, timeout, _written_tensors(spec, mvals))

    def inplace_fake(*args: Any) -> None:
        return None

    def functional_kernel(*args: Any) -> Any:
        ref, vals, async_op, hints, timeout = split(args)
        mvals, new = _fresh(spec, method_values(vals), torch.clone)
        _run(spec, ref, mvals, async_op, hints, timeout, _written_tensors(spec, mvals))
        return new

    def functional_fake(*args: Any) -> Any:
        value = args[1 + wpos]
        if written.kind == TENSORS:
            return [torch.empty_like(t) for t in value]
        return torch.empty_like(value)

    return {
        spec.inplace_name: (inplace_kernel, inplace_fake),
        spec.functional_name: (functional_kernel, functional_fake),
    }


def _wait_inplace(inputs: list[torch.Tensor]) -> None:
    pending.wait(inputs)


def _wait_functional(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    pending.wait(inputs)
    return [t.clone() for t in inputs]


def define_ops() -> torch.library.Library:
    """Define every op of the table once per process; return the library."""
    global _lib
    if _lib is not None:
        return _lib
    # torch ships torch.library.Library without annotations, hence the no-untyped-call
    # ignores on it and its methods here.
    lib = torch.library.Library(NAMESPACE, "DEF")  # type: ignore[no-untyped-call]
    tags = (torch.Tag.pt2_compliant_tag,)
    entries: list[tuple[str, str, Callable[..., Any], Callable[..., Any]]] = []
    for spec in OPS:
        for name, (kernel, fake) in _kernels(spec).items():
            sig = schema(spec, REF_TYPE, inplace=name.endswith("_"))
            entries.append((name, sig, kernel, fake))
    entries.append(
        (
            "torchcomm_wait_tensors_",
            "(Tensor(a!)[] inputs) -> ()",
            _wait_inplace,
            lambda inputs: None,
        )
    )
    entries.append(
        (
            "torchcomm_wait_tensors",
            "(Tensor[] inputs) -> Tensor[]",
            _wait_functional,
            lambda inputs: [torch.empty_like(t) for t in inputs],
        )
    )
    for name, sig, kernel, fake in entries:
        lib.define(f"{name}{sig}", tags=tags)  # type: ignore[no-untyped-call]
        lib.impl(name, kernel, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
        lib._register_fake(name, fake)  # type: ignore[no-untyped-call]
        # Collectives must run in program order on every rank: ORDERED keeps PT2 from
        # reordering or dropping them (an effect token threads through the graph).
        lib._register_effectful_op(f"{NAMESPACE}::{name}", EffectType.ORDERED)
    _lib = lib
    return lib


def op(name: str) -> Any:
    """``torch.ops.torchcomms.<name>.default``."""
    return getattr(getattr(torch.ops, NAMESPACE), name).default
