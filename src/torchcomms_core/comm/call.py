"""One operation being prepared: its checked timeout and hints, its completion steps, and
the argument objects its hooks see.

``CommBase._guard`` returns a :class:`Call`; the operations stage their tensors on it
(contiguous stand-ins for results, copied back on completion; AVG and PREMUL_SUM lowered to
SUM for a backend without them) and ``CommBase._issue`` hands its steps to the
``TorchWork``; :func:`run_pre_hooks` and :func:`run_post_hooks` build the hooks'
argument objects and call the hooks. Imports the operations and foundation layers and
torch, never the communicator.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms_core.foundation.work import TorchWork
from torchcomms_core.operations.args import OpArgs, args_class, next_op_id, op_name, post_args
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.operations.validation import writable

if TYPE_CHECKING:
    from torchcomms_core.foundation.protocols import Communicator

#: A communicator's registered hooks, by handle id.
Hooks = dict[int, Callable[..., Any]]


def _in(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when contiguous, else a contiguous copy (an input the backend reads)."""
    return t if t.is_contiguous() else t.contiguous()


class Call:
    """One operation being prepared: checked timeout and hints, and its completion steps."""

    __slots__ = ("op", "timeout", "hints", "finishers")

    def __init__(self, op: str, timeout: timedelta | None, hints: dict[str, str] | None) -> None:
        self.op = op
        self.timeout = timeout
        self.hints = hints
        self.finishers: list[Callable[[], object]] | None = None

    def then(self, step: Callable[[], object], first: bool = False) -> None:
        if self.finishers is None:
            self.finishers = [step]
        elif first:
            self.finishers.insert(0, step)
        else:
            self.finishers.append(step)

    def out(self, t: torch.Tensor, keep: bool = False) -> torch.Tensor:
        """A contiguous stand-in for a result tensor (``keep``: its values are read too)."""
        if t.is_contiguous():
            return t
        writable(self.op, t)
        tmp = t.contiguous() if keep else torch.empty_like(t, memory_format=torch.contiguous_format)
        self.then(lambda: t.copy_(tmp))
        return tmp

    def lower(
        self, red: ReduceOp, native: frozenset[RedOpType], result: torch.Tensor | None, size: int
    ) -> tuple[ReduceOp, Any]:
        """``(op for the backend, PREMUL factor or None)`` for AVG/PREMUL_SUM it lacks.

        AVG becomes SUM and ``result`` (when this rank gets one) is divided by ``size`` on
        completion; PREMUL_SUM becomes SUM on inputs the caller multiplies by the factor.
        """
        if red._type in native:
            return red, None
        if red._type is RedOpType.AVG:
            if result is not None:
                self.then(lambda: result.div_(size), first=True)
            return ReduceOp.SUM, None
        return ReduceOp.SUM, red.factor

    def reduce_in_place(
        self, tensor: torch.Tensor, red: ReduceOp, native: frozenset[RedOpType], size: int
    ) -> tuple[torch.Tensor, ReduceOp]:
        """``(buffer, op for the backend)`` to reduce into ``tensor`` itself, its values read.

        The buffer is ``tensor`` or a contiguous stand-in copied back on completion, with
        the PREMUL factor already applied; AVG divides it on completion (:meth:`lower`).
        """
        buf = self.out(tensor, keep=True)
        bop, factor = self.lower(red, native, buf, size)
        if factor is not None:
            buf.mul_(factor)
        return buf, bop


def run_pre_hooks(
    comm: Communicator,
    hooks: Hooks,
    name: str,
    values: tuple[Any, ...],
    async_op: bool = False,
    timeout: Any = None,
    hints: Any = None,
    op_id: int | None = None,
) -> OpArgs:
    """Build the ``<Op>PreHookArgs`` of operation ``name`` of ``comm`` and call ``hooks``.

    Pre-hooks see the operation's work before it starts (``args.work``, ``NOT_STARTED``).
    """
    args = args_class(name)(
        name, next_op_id() if op_id is None else op_id, values, async_op, timeout, hints
    )
    args.work = TorchWork.not_started(comm, name)
    label = op_name(name)
    for hook in tuple(hooks.values()):
        hook(label, args.op_id, args)
    return args


def run_post_hooks(hooks: Hooks, args: OpArgs, work: TorchWork) -> None:
    """Call the post ``hooks`` of the operation ``args`` describes, which ``work`` ran."""
    post = post_args(args, work)
    for hook in tuple(hooks.values()):
        hook(args.op_id, post)
