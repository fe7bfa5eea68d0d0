"""``clog``: a pipe-delimited log of a communicator's operations, one line per event.

Every line is ``time_ns|pid|comm|rank|size|op_id|event|op|key=value|...``:

- ``Q`` (enqueued): always, when the call reaches the communicator; carries ``async``,
  and ``peer``/``root``/``op``/``ranks``/``num_ops`` where the operation has them;
- ``S`` (started) and ``E`` (ended), with ``events=["ALL"]`` or ``["LIFECYCLE"]``: ``S``
  as the operation is handed to the engine, ``E`` once it has completed (a synchronous
  call on return, an asynchronous one when ``wait()``/``is_completed()`` finds it done);
- ``W`` (waited), for asynchronous operations with those events, just before their ``E``.

``verbose=["buffers"]`` adds ``in=`` and ``out=`` with each tensor's shape, dtype and
data pointer. ``output`` is a file path (appended to, created 0600) or ``"stdout"`` /
``"stderr"``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

from .._errors import CommInputError, CommTypeError
from ..comm.handles import RemovableHandle
from ..comm.operations import TorchComm
from . import _args

_EVENTS = ("ALL", "LIFECYCLE")
_VERBOSE = ("buffers",)


def _names(value: Any, arg: str, allowed: tuple[str, ...], upper: bool) -> set[str]:
    if isinstance(value, str) or not isinstance(value, (list, tuple, set)):
        raise CommTypeError(
            f"clog: {arg} must be a list of strings, e.g. [{allowed[0]!r}], got {value!r}"
        )
    out = set()
    for item in value:
        name = str(item).upper() if upper else str(item).lower()
        if not isinstance(item, str) or name not in allowed:
            raise CommInputError(
                f"clog: {arg} entry {item!r} is not understood; use any of {list(allowed)}"
            )
        out.add(name)
    return out


def _buffers(value: Any) -> str:
    parts = []
    for t in _args.tensors(value):
        shape = "x".join(map(str, t.shape)) or "scalar"
        parts.append(f"{shape}:{str(t.dtype).replace('torch.', '')}@{t.data_ptr():#x}")
    return ",".join(parts)


class clog:  # noqa: N801 - the reference's name
    """Log the operations of the communicators it is registered with to ``output``."""

    def __init__(self, output: str, events: list[str], verbose: list[str] = []) -> None:  # noqa: B006 - the reference's default
        if not isinstance(output, str) or not output:
            raise CommTypeError(
                f"clog: output must be a file path or 'stdout'/'stderr', got {output!r}"
            )
        self.output = output
        self.events = sorted(_names(events, "events", _EVENTS, True))
        self.verbose = sorted(_names(verbose, "verbose", _VERBOSE, False))
        self._lifecycle = bool(self.events)
        self._buffers = "buffers" in self.verbose
        self._lock = threading.Lock()
        self._file: TextIO | None = None
        self._handles: list[RemovableHandle] = []

    def _stream(self) -> TextIO:
        if self._file is None:
            if self.output in ("stdout", "stderr"):
                self._file = sys.stdout if self.output == "stdout" else sys.stderr
            else:
                try:
                    fd = os.open(self.output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                except OSError as exc:
                    raise CommInputError(
                        f"clog: cannot open {self.output!r} for appending "
                        f"({exc}); pass a writable file path"
                    ) from None
                self._file = os.fdopen(fd, "a", buffering=1)
        return self._file

    def register_with_comm(self, comm: TorchComm) -> clog:
        """Log ``comm``'s operations from now on; returns the logger itself."""
        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"register_with_comm: expected a TorchComm, got {type(comm).__name__}"
            )
        with self._lock:
            self._stream()  # a bad path is reported now, not at the first operation
        async_ops: dict[int, tuple[str, bool]] = {}
        self._handles += [
            comm.register_pre_hook(
                lambda name, op_id, args: self._pre(comm, async_ops, name, op_id, args)
            ),
            comm.register_post_hook(lambda op_id, args: self._post(comm, async_ops, op_id, args)),
        ]
        return self

    def unregister(self) -> None:
        """Stop logging (the file stays open until :meth:`close`)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def close(self) -> None:
        """Stop logging and close the file."""
        self.unregister()
        with self._lock:
            if self._file is not None and self._file not in (sys.stdout, sys.stderr):
                self._file.close()
            self._file = None

    # -- lines -----------------------------------------------------------------------

    def _write(self, comm: TorchComm, op_id: int, event: str, op: str, details: list[str]) -> None:
        line = "|".join(
            [
                str(time.time_ns()),
                str(os.getpid()),
                comm.get_name(),
                str(comm.get_rank()),
                str(comm.get_size()),
                str(op_id),
                event,
                op,
                *details,
            ]
        )
        with self._lock:
            stream = self._file
            if stream is None or stream.closed:
                return
            stream.write(line + "\n")

    def _pre(
        self,
        comm: TorchComm,
        pending: dict[int, tuple[str, bool]],
        name: Any,
        op_id: int,
        args: Any,
    ) -> None:
        op = str(getattr(name, "name", name))
        fields = _args.fields(args)
        is_async = bool(getattr(args, "async_op", False))
        details = [f"async={int(is_async)}"]
        peer = _args.peer(fields)
        if peer is not None:
            details.append(f"peer={peer}")
        for key in ("root", "op", "name", "ranks", "num_ops"):
            if key in fields and fields[key] is not None:
                value = fields[key]
                text = str(getattr(value, "name", value))
                if key == "op":  # "ReduceOp.SUM" -> "SUM"
                    text = text.rsplit(".", 1)[-1]
                details.append(f"{key}={text}")
        batch = _args.batch_ops(args) if op == "batch_op_issue" else None
        if batch is not None and "num_ops" not in fields:
            details.append(f"num_ops={len(batch)}")
        if self._buffers:
            if batch is not None:
                details.append(
                    "ops=" + ",".join(f"{kind}:{where}:{_buffers(t)}" for kind, t, where in batch)
                )
            else:
                inp, out = _args.raw_io(op, fields)
                details += [f"in={_buffers(inp)}", f"out={_buffers(out)}"]
        self._write(comm, op_id, "Q", op, details)
        if self._lifecycle:
            self._write(comm, op_id, "S", op, [])
        pending[op_id] = (op, is_async)

    def _post(
        self, comm: TorchComm, pending: dict[int, tuple[str, bool]], op_id: int, args: Any
    ) -> None:
        op, is_async = pending.pop(op_id, ("?", False))
        if not self._lifecycle:
            return
        work = getattr(args, "work", None)
        done = work is None or getattr(work, "is_completed", lambda: True)()
        if not is_async or done:
            if is_async:
                self._write(comm, op_id, "W", op, [])
            self._write(comm, op_id, "E", op, [])
            return

        def ended() -> None:
            try:
                self._write(comm, op_id, "W", op, [])
                self._write(comm, op_id, "E", op, [])
            except Exception:  # logging must never fail the operation
                pass

        assert work is not None  # a None work counts as done above
        finishers = getattr(work, "_finishers", None)
        try:
            work._finishers = [*(finishers or ()), ended]
        except AttributeError:  # a work object without completion steps: log now
            ended()

    def __repr__(self) -> str:
        return f"<clog output={self.output!r} events={self.events} verbose={self.verbose}>"
