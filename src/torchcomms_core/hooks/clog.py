"""``clog``: the reference's pipe-delimited log of collective operations (format V1).

The file (created 0600 and truncated when the logger is made, or ``"stdout"`` /
``"stderr"``) starts with ``V|1|base_timestamp=<epoch seconds>``; then, per line:

- ``new_comm|comm=<name>|rank=<rank>|world_size=<size>`` when a communicator is
  registered, and ``split|parent=<name>|child=<name>|ranks=<r0>,<r1>,...`` for a split;
- ``C<corr_id>|sig|<op>|<key>=<value>|...|comm=<name>``: one line per distinct operation
  signature (operation, sizes, dtype, reduction, root or peer, ``async_op``, communicator);
  repeated calls with the same signature reuse its ``corr_id``;
- ``C<corr_id>|Q|work_id=<n>|+<seconds>``: each call as it is issued (``work_id`` counts
  the calls of this logger);
- with ``events=["ALL"]`` or ``["LIFECYCLE"]``: ``C<corr_id>|S|+<s>`` as the operation is
  handed to the engine, ``C<corr_id>|E|+<s>`` once it completed and, for an asynchronous
  call, ``C<corr_id>|W|+<s>`` when the wait found it done.

``+<seconds>`` is the time since ``base_timestamp`` (millisecond precision).
``verbose=["buffers"]`` adds ``buf=``/``in=``/``out=`` data pointers to signatures.
One logger may serve several communicators; each logger has its own file.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

import torch

from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.hooks import _args
from torchcomms_core.operations.table import lists

_EVENTS = ("ALL", "LIFECYCLE")
_VERBOSE = ("buffers",)
#: The log format version the header names.
LOG_VERSION = 1

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.int32: "i32",
    torch.int64: "i64",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "bool",
}
for _name, _short in (("float8_e4m3fn", "fp8e4m3"), ("float8_e5m2", "fp8e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _short
_RED_OPS = {
    "SUM": "sum",
    "PRODUCT": "prod",
    "MIN": "min",
    "MAX": "max",
    "BAND": "band",
    "BOR": "bor",
    "BXOR": "bxor",
    "PREMUL_SUM": "premul_sum",
    "AVG": "avg",
}
# Operations whose signature lists counts per tensor (``in_counts``/``out_counts``).
_LIST_OUT = lists("output")
_LIST_IN = lists("input")
_NO_SIGNATURE = frozenset({"split", "new_window", "finalize"})


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


def _dtype(ts: list[torch.Tensor]) -> str:
    return _DTYPES.get(ts[0].dtype, "other") if ts else "other"


def _red_op(value: Any) -> str:
    kind = getattr(value, "type", getattr(value, "_type", value))
    name = str(getattr(kind, "name", kind)).rsplit(".", 1)[-1].upper()
    return _RED_OPS.get(name, "unknown")


def _counts(ts: list[torch.Tensor]) -> str:
    return ",".join(str(t.numel()) for t in ts)


def _ptrs(ts: list[torch.Tensor]) -> str:
    return ",".join(f"{t.data_ptr():#x}" for t in ts)


def signature(op: str, fields: dict[str, Any], is_async: bool, buffers: bool) -> str:
    """``<op>|<key>=<value>|...`` of one call, without the communicator (see the module)."""
    flag = "t" if is_async else "f"
    if op == "barrier":
        return f"barrier|async_op={flag}"
    if op == "batch_op_issue":
        ops = fields.get("ops") or fields.get("num_ops") or []
        num = ops if isinstance(ops, int) else len(ops)
        return f"batch_op_issue|num_ops={num}|async_op={flag}"
    inp, out = _args.raw_io(op, fields)
    ins, outs = _args.tensors(inp), _args.tensors(out)
    parts = [op]
    if op == "all_to_all_v_single":
        parts += [
            "in_splits=" + ",".join(str(int(s)) for s in fields.get("input_split_sizes") or ()),
            "out_splits=" + ",".join(str(int(s)) for s in fields.get("output_split_sizes") or ()),
        ]
    else:
        in_key = "in_counts" if op in _LIST_IN else "in_count"
        out_key = "out_counts" if op in _LIST_OUT else "out_count"
        parts += [f"{in_key}={_counts(ins) or 0}", f"{out_key}={_counts(outs) or 0}"]
    parts.append(f"dtype={_dtype(ins or outs)}")
    if "op" in fields and fields["op"] is not None:
        parts.append(f"red_op={_red_op(fields['op'])}")
    if fields.get("root") is not None:
        parts.append(f"root={int(fields['root'])}")
    peer = _args.peer(fields)
    if op in ("send", "recv") and peer is not None:
        parts.append(f"peer={int(peer)}")
    parts.append(f"async_op={flag}")
    if buffers:
        if op in _args.IN_PLACE:
            parts.append(f"buf={_ptrs(ins)}")
        elif op == "send":
            parts.append(f"in={_ptrs(ins)}")
        elif op == "recv":
            parts.append(f"out={_ptrs(outs)}")
        else:
            parts += [f"in={_ptrs(ins)}", f"out={_ptrs(outs)}"]
    return "|".join(parts)


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
        self._handles: list[RemovableHandle] = []
        self._comms: list[Any] = []  # weak references to the registered communicators
        self._signatures: dict[str, int] = {}
        self._work_ids = 0
        self._file: TextIO | None = self._open(output)
        self.base_timestamp = round(time.time(), 3)
        self._base_ns = time.time_ns()
        self._line(f"V|{LOG_VERSION}|base_timestamp={self.base_timestamp:.3f}")

    @staticmethod
    def _open(output: str) -> TextIO:
        if output in ("stdout", "stderr"):
            return sys.stdout if output == "stdout" else sys.stderr
        try:
            fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError as exc:
            raise CommInputError(
                f"clog: cannot open {output!r} for writing ({exc}); pass a writable file path"
            ) from None
        return os.fdopen(fd, "w", buffering=1)

    def register_with_comm(self, comm: TorchComm) -> clog:
        """Log ``comm``'s operations from now on; returns the logger itself."""
        import weakref

        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"register_with_comm: expected a TorchComm, got {type(comm).__name__}"
            )
        if any(ref() is comm for ref in self._comms):
            raise CommInputError(
                f"clog: already registered with communicator {comm.get_name()!r}; "
                f"register each communicator once"
            )
        if self._file is None:
            raise CommInputError("clog: this logger was closed; make a new one")
        self._comms.append(weakref.ref(comm))
        name = comm.get_name()
        self._line(f"new_comm|comm={name}|rank={comm.get_rank()}|world_size={comm.get_size()}")
        pending: dict[int, tuple[int, bool]] = {}
        self._handles += [
            comm.register_pre_hook(
                lambda op, op_id, args: self._pre(comm, name, pending, op, op_id, args)
            ),
            comm.register_post_hook(lambda op_id, args: self._post(pending, op_id, args)),
        ]
        return self

    def unregister(self) -> None:
        """Stop logging (the file stays open until :meth:`close`)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._comms = []

    def close(self) -> None:
        """Stop logging and close the file."""
        self.unregister()
        with self._lock:
            if self._file is not None and self._file not in (sys.stdout, sys.stderr):
                self._file.close()
            self._file = None

    # -- lines -----------------------------------------------------------------------

    def _line(self, text: str) -> None:
        with self._lock:
            stream = self._file
            if stream is None or stream.closed:
                return
            stream.write(text + "\n")
            stream.flush()

    def _event(self, corr_id: int, event: str) -> None:
        delta = (time.time_ns() - self._base_ns) / 1e9
        self._line(f"C{corr_id}|{event}|+{delta:.3f}")

    def _pre(
        self,
        comm: TorchComm,
        name: str,
        pending: dict[int, tuple[int, bool]],
        op_name: Any,
        op_id: int,
        args: Any,
    ) -> None:
        op = str(getattr(op_name, "name", op_name))
        fields = _args.fields(args)
        if op == "split":
            ranks = fields.get("ranks") or []
            child = fields.get("name", "")
            self._line(
                f"split|parent={name}|child={child}|ranks={','.join(str(int(r)) for r in ranks)}"
            )
            return
        if op in _NO_SIGNATURE:
            return
        is_async = bool(getattr(args, "async_op", False))
        key = signature(op, fields, is_async, self._buffers) + f"|comm={name}"
        with self._lock:
            corr_id = self._signatures.get(key)
            fresh = corr_id is None
            if corr_id is None:
                corr_id = self._signatures[key] = len(self._signatures) + 1
            self._work_ids += 1
            work_id = self._work_ids
        if fresh:
            self._line(f"C{corr_id}|sig|{key}")
        delta = (time.time_ns() - self._base_ns) / 1e9
        self._line(f"C{corr_id}|Q|work_id={work_id}|+{delta:.3f}")
        pending[op_id] = (corr_id, is_async)

    def _post(self, pending: dict[int, tuple[int, bool]], op_id: int, args: Any) -> None:
        found = pending.pop(op_id, None)
        if found is None or not self._lifecycle:
            return
        corr_id, is_async = found
        self._event(corr_id, "S")
        work = getattr(args, "work", None)
        done = work is None or getattr(work, "is_completed", lambda: True)()
        if not is_async or done:
            self._event(corr_id, "E")
            if is_async:
                self._event(corr_id, "W")
            return

        def ended() -> None:
            try:
                self._event(corr_id, "E")
                self._event(corr_id, "W")
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
