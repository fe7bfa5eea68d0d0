"""Profiler records for process-group calls over torchcomms, as c10d and its engine make them.

A plain gloo group shows two records per call in ``torch.profiler``: the dispatcher op
(``c10d::allreduce_``, while the call is issued) and the engine's work
(``gloo:all_reduce``, from issue to completion), each with its input shapes. Calls into a
Python ``ProcessGroup`` skip the dispatcher, and torchcomms runs an engine call of its own
shape (flattened, coalesced), so the bridge writes both records itself and keeps the
engine's own records out of the trace while it issues.

``torch.distributed`` imports this module while ``torch`` is half-initialised, so the
profiler's functions are looked up when called.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _profiler_enabled() -> bool:
    return torch._C._autograd._profiler_enabled()


def _enable_record_function(enable: bool) -> None:
    torch._C._autograd._enable_record_function(enable)


def _record_function_with_args_enter(name: str, *args: Any) -> Any:
    return torch._C._autograd._record_function_with_args_enter(name, *args)


def _record_function_with_args_exit(handle: Any) -> None:
    torch._C._autograd._record_function_with_args_exit(handle)


class CallRecord:
    """The records of one call: the op record closes when issued, work records when done."""

    __slots__ = ("_op", "_work")

    def __init__(self, op: Any, work: list[Any]) -> None:
        self._op = op
        self._work = work

    def issued(self) -> None:
        """The call has been issued: engine records count again and the op record ends."""
        _enable_record_function(True)
        op, self._op = self._op, None
        if op is not None:
            _record_function_with_args_exit(op)

    def done(self) -> None:
        """The work completed (or failed): its record ends."""
        work, self._work = self._work, []
        for record in work:
            _record_function_with_args_exit(record)


def is_enabled() -> bool:
    """Whether a profiler is recording (checked before building any record's arguments)."""
    return torch._C._autograd._profiler_enabled()


def begin(
    op_name: str | None,
    op_inputs: Sequence[Any],
    works: Sequence[tuple[str, Sequence[torch.Tensor]]],
    quiet: bool = True,
) -> CallRecord | None:
    """Open the records of one call, or return ``None`` when no profiler is running.

    ``op_inputs`` mirror the dispatcher op's arguments (tensors where it takes a tensor,
    anything else where it takes a list or an option: both show as ``[]``); ``works``
    name the engine's work records and the tensors each records (gloo runs some calls as
    several works). With ``quiet``, records stay off on this thread until
    :meth:`CallRecord.issued`.
    """
    if not _profiler_enabled():
        return None
    op = _record_function_with_args_enter(op_name, *op_inputs) if op_name is not None else None
    work = [_record_function_with_args_enter(name, *inputs) for name, inputs in works]
    if quiet:
        # What torchcomms runs underneath must not add engine records of its own shape.
        _enable_record_function(False)
    return CallRecord(op, work)


def slots(n: int) -> tuple[None, ...]:
    """``n`` non-tensor arguments (they record as ``[]``)."""
    return (None,) * n
