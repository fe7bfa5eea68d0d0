"""Route ``TorchComm`` collectives through the ``torchcomms`` ops where that is needed.

A wrapped method runs the original unless it is being traced (``torch.compile``, fake or
functional tensors) or a result must carry a gradient; then it calls the op. Plugin
collectives are not ops: while tracing they are a graph break with an explanation.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, cast

import torch

from torchcomms_core.foundation.errors import CommTypeError
from torchcomms_core.functional import pending
from torchcomms_core.functional.async_results import FakeWork, TorchCommsAsyncTensor
from torchcomms_core.functional.autograd import DIFFERENTIABLE
from torchcomms_core.functional.ops import ORIGINALS, CommRef, op
from torchcomms_core.functional.table import IN, INTS, OPS, REDUCE_OP, TENSOR, TENSORS, OpSpec
from torchcomms_core.operations.reduce_op import ReduceOp

_TRAILING = ("async_op", "hints", "timeout")
_MISSING = object()
_WRAPPED = "__torchcomms_compile_wrapped__"


def _traced(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or torch._is_functional_tensor(t) or t.is_meta


def _needs_ops(differentiable: bool, values: Any) -> bool:
    """Whether eager arguments must go through the ops (grad to carry, or traced tensors)."""
    grad = differentiable and torch.is_grad_enabled()
    for v in values:
        if isinstance(v, torch.Tensor):
            if (grad and v.requires_grad) or _traced(v):
                return True
        elif isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and ((grad and t.requires_grad) or _traced(t)):
                    return True
    return False


class _Plan:
    """A spec flattened to plain constants, which the tracer reads cheaply."""

    __slots__ = (
        "method",
        "names",
        "kinds",
        "n",
        "widx",
        "wkind",
        "differentiable",
        "inplace",
        "functional",
        "reads",
    )

    def __init__(self, spec: OpSpec) -> None:
        self.method = spec.method
        self.names = tuple(p.name for p in spec.params) + _TRAILING
        self.kinds = tuple(p.kind for p in spec.params)
        self.n = len(spec.params)
        written = spec.written
        self.widx = -1 if written is None else spec.params.index(written)
        self.wkind = "" if written is None else written.kind
        self.differentiable = spec.method in DIFFERENTIABLE
        self.inplace = None if written is None else op(spec.inplace_name)
        self.functional = op(spec.functional_name)
        # Tensors an async collective reads while in flight: kept alive until its wait.
        self.reads = tuple(
            i for i, p in enumerate(spec.params) if p.kind in (TENSOR, TENSORS) and p.role == IN
        )


def _bind(
    plan: _Plan, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[list[Any], bool, Any, Any]:
    names = plan.names
    if len(args) > len(names):
        raise CommTypeError(
            f"{plan.method}() takes at most {len(names)} arguments "
            f"({', '.join(names)}), got {len(args)}"
        )
    values = list(args) + [_MISSING] * (len(names) - len(args))
    for key, value in kwargs.items():
        if key not in names:
            raise CommTypeError(f"{plan.method}() got an unexpected keyword argument {key!r}")
        i = names.index(key)
        if values[i] is not _MISSING:
            raise CommTypeError(f"{plan.method}() got multiple values for argument {key!r}")
        values[i] = value
    n = plan.n
    for i in range(n):
        if values[i] is _MISSING:
            raise CommTypeError(f"{plan.method}() is missing required argument {names[i]!r}")
    async_op = values[n] if values[n] is not _MISSING else False
    hints = values[n + 1] if values[n + 1] is not _MISSING else None
    timeout = values[n + 2] if values[n + 2] is not _MISSING else None
    return values[:n], bool(async_op), hints, timeout


def _schema_values(plan: _Plan, values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for kind, v in zip(plan.kinds, values, strict=True):
        if kind == REDUCE_OP:
            if not isinstance(v, ReduceOp):
                raise CommTypeError(
                    f"{plan.method}: op must be a torchcomms.ReduceOp, got {type(v).__name__}"
                )
            factor = v.factor
            if isinstance(factor, torch.Tensor):
                if torch.compiler.is_compiling():
                    raise CommTypeError(
                        f"{plan.method}: ReduceOp.PREMUL_SUM with a tensor factor cannot be "
                        f"compiled; pass the factor as a Python float"
                    )
                factor = float(factor.item())
            out.append(v.type.name)
            out.append(factor)
        elif kind in (TENSORS, INTS):
            out.append(list(v))
        else:
            out.append(v)
    return out


def _seconds(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        # Fields, not total_seconds(): the tracer reads attributes but cannot call the method.
        return timeout.days * 86400.0 + timeout.seconds + timeout.microseconds * 1e-6
    return float(timeout)


# Each communicator's CommRef lives on the communicator itself, under this attribute: made
# when the communicator is created, gone with it. Not a module-level weak dictionary: the
# tracer would inline the dictionary lookup and guard on the dictionary's keys, which change
# whenever any communicator is created or collected (a guard built after a collection then
# fails, and every new communicator would recompile the graph).
_REF_ATTR = "_torchcomms_functional_ref"


def ref_of(comm: Any) -> CommRef:
    """The communicator's :class:`CommRef` (made when the communicator is created)."""
    ref = comm.__dict__.get(_REF_ATTR)
    if ref is None:
        ref = CommRef(comm)
        setattr(comm, _REF_ATTR, ref)
    return cast(CommRef, ref)


def _via_ops(plan: _Plan, comm: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a collective through the functional op (tracing, or a result that needs grad).

    While tracing, only the functional ops are used: PT2 threads effect tokens (program
    order, no dead-code elimination) through ops that do not mutate their inputs, so the
    in-place form is the functional op followed by ``copy_`` into the caller's tensors.
    """
    values, async_op, hints, timeout = _bind(plan, args, kwargs)
    compiling = torch.compiler.is_compiling()
    tracing = compiling or _needs_ops(False, values)
    ref = getattr(comm, _REF_ATTR) if compiling else ref_of(comm)
    svals = _schema_values(plan, values)
    hints = None if hints is None else dict(hints)
    seconds = _seconds(timeout)
    result = plan.functional(ref, *svals, async_op, hints, seconds)
    if plan.widx < 0:  # send, barrier: the result is a token to wait on
        if not async_op:
            return None
        work = None if tracing else pending.take(result)
        if work is not None:
            return work
        return FakeWork([result], _reads(plan, values), None, single=True)
    many = plan.wkind == TENSORS
    results = list(result) if many else [result]
    grad = plan.differentiable and torch.is_grad_enabled() and _needs_grad(values)
    targets = None
    if not grad:
        wvalue = values[plan.widx]
        targets = list(wvalue) if many else [wvalue]
    if async_op and tracing:
        return FakeWork(results, _reads(plan, values), targets, single=not many)
    if async_op:
        wrapped = []
        for r in results:
            work = pending.take(r)
            wrapped.append(TorchCommsAsyncTensor.wrap(r, work) if work is not None else r)
        return wrapped if many else wrapped[0]
    if targets is None:
        return result
    for t, r in zip(targets, results, strict=True):
        t.copy_(r)
    return None


def _reads(plan: _Plan, values: list[Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for i in plan.reads:
        v = values[i]
        if isinstance(v, torch.Tensor):
            out.append(v)
        else:
            out.extend(v)
    return out


def _needs_grad(values: list[Any]) -> bool:
    for v in values:
        if isinstance(v, torch.Tensor) and v.requires_grad:
            return True
        if isinstance(v, (list, tuple)):
            for t in v:
                if isinstance(t, torch.Tensor) and t.requires_grad:
                    return True
    return False


def _wrap_method(spec: OpSpec, original: Any) -> Any:
    plan = _Plan(spec)
    differentiable = plan.differentiable

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not torch.compiler.is_compiling() and not _needs_ops(
            differentiable, (*args, *kwargs.values())
        ):
            return original(self, *args, **kwargs)
        return _via_ops(plan, self, args, kwargs)

    setattr(method, _WRAPPED, original)
    return method


def _wrap_init(original: Any) -> Any:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
        original(self, *args, **kwargs)
        setattr(self, _REF_ATTR, CommRef(self))
        mark_plugin_collectives()

    setattr(__init__, _WRAPPED, original)
    return __init__


def mark_plugin_collectives() -> None:
    """Make every installed plugin collective a clean graph break when traced."""
    from torchcomms_core.comm.operations import TorchComm
    from torchcomms_core.plugin_host.manager import registered_collectives

    for name, coll in registered_collectives().items():
        method = TorchComm.__dict__.get(name)
        if method is None or getattr(method, _WRAPPED, None) is not None:
            continue
        reason = (
            f"torchcomms: plugin collective {name!r} ({coll.provider or 'a plugin'}) runs "
            f"eagerly: plugin collectives are not torch.library ops, so torch.compile breaks "
            f"the graph at this call. Call it outside the compiled function, or compile the "
            f"code before and after it separately (see docs/torch-compile.md)"
        )
        # torch._dynamo.disable carries no annotations in torch.
        disabled = torch._dynamo.disable(method, reason=reason)  # type: ignore[no-untyped-call]
        setattr(disabled, _WRAPPED, method)
        setattr(TorchComm, name, disabled)


def patch_torchcomm() -> None:
    """Wrap ``TorchComm``'s collectives and constructor (idempotent)."""
    from torchcomms_core.comm.operations import TorchComm

    for spec in OPS:
        current = getattr(TorchComm, spec.method)  # Face's method, or our wrapper of it
        if getattr(current, _WRAPPED, None) is not None:
            continue
        ORIGINALS[spec.method] = current
        setattr(TorchComm, spec.method, _wrap_method(spec, current))
    init = TorchComm.__init__  # inherited from CommBase until wrapped here
    if getattr(init, _WRAPPED, None) is None:
        TorchComm.__init__ = _wrap_init(init)  # type: ignore[method-assign]
    # Communicators created before the compile path was switched on get their ref now.
    from torchcomms_core.comm.base import live_communicators

    for live in live_communicators():
        ref_of(live)
