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

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from torchcomms_core.c10d.daemon import Daemon


def _profiler_enabled() -> bool:
    return torch._C._autograd._profiler_enabled()


def _enable_record_function(enable: bool) -> None:
    torch._C._autograd._enable_record_function(enable)


def _record_function_with_args_enter(name: str, *args: Any) -> Any:
    return torch._C._autograd._record_function_with_args_enter(name, *args)


def _record_function_with_args_exit(handle: Any) -> None:
    torch._C._autograd._record_function_with_args_exit(handle)


class CallRecord:
    """The records of one call: the op record closes when issued, work records when done.

    A work record ends on another thread than the one that opened it, as an engine's
    work record ends on the engine's thread: the profiler marks such records async
    (``FunctionEvent.is_async``), which is how c10d's work records read.
    """

    __slots__ = ("_op", "_work", "_thread")

    def __init__(self, op: Any, work: list[Any]) -> None:
        self._op = op
        self._work = work
        self._thread = threading.get_ident()

    def issued(self) -> None:
        """The call has been issued: engine records count again and the op record ends."""
        _enable_record_function(True)
        op, self._op = self._op, None
        if op is not None:
            _record_function_with_args_exit(op)

    def done(self) -> None:
        """The work completed (or failed): its records end, off the opening thread."""
        work, self._work = self._work, []
        if not work:
            return
        if threading.get_ident() != self._thread:
            _exit_all(work)
        else:
            _close_elsewhere(work)


def _exit_all(records: list[Any]) -> None:
    for record in records:
        _record_function_with_args_exit(record)


def _close(request: tuple[list[Any], threading.Event]) -> None:
    records, done = request
    try:
        _exit_all(records)
    finally:
        done.set()


# A thread that ends work records for the thread that opened them, while it waits (see
# _close_elsewhere); it starts the first time a profiler needs it.
_closer: Daemon[tuple[list[Any], threading.Event]] = Daemon("torchcomms-records", _close)


def _close_elsewhere(records: list[Any]) -> None:
    """End ``records`` on the closer's thread; the caller blocks until they ended, so they
    end before a profiler that is about to stop can miss them."""
    done = threading.Event()
    _closer.put((records, done))
    done.wait()


def is_enabled() -> bool:
    """Whether a profiler is recording (checked before building any record's arguments)."""
    return torch._C._autograd._profiler_enabled()


def enter(name: str, inputs: Sequence[Any]) -> Any:
    """Open one record (a dispatcher op's) with ``inputs``; end it with :func:`exit`."""
    return _record_function_with_args_enter(name, *inputs)


def exit(handle: Any) -> None:  # noqa: A001 - the pair of enter
    """End a record opened with :func:`enter`."""
    _record_function_with_args_exit(handle)


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


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Within this block, what torchcomms runs adds no records of its own (the call's
    records were opened already)."""
    _enable_record_function(False)
    try:
        yield
    finally:
        _enable_record_function(True)


def slots(n: int) -> tuple[None, ...]:
    """``n`` non-tensor arguments (they record as ``[]``)."""
    return (None,) * n
