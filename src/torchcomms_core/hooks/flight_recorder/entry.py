"""What the flight recorder keeps of one operation, taken at record time.

Owns the layout of a recorded entry (a list, whose fields are named by the indices
``_RECORD_ID`` ... ``_WORK``), the compact descriptions of an operation's tensors
(``_io``), the capture of the caller's stack (``_frames``) and the recorded operation
names (``_op_str``). Recording runs on every operation, so only raw values are kept;
:mod:`.dump` turns them into c10d's fields. The names are private to the flight recorder
package (and to the c10d bridge's engine lane, which builds entries of this layout).

May import torch and :mod:`torchcomms_core.hooks._args` only: the ring, the dump format
and the hook all build on it.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any

import torch

from torchcomms_core.hooks import _args

# At most this many frames of a caller's stack are kept.
_MAX_FRAMES = 32
# torchcomms_core itself: its frames are left out of recorded stacks.
_HERE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# -- recording: compact, taken at record time ---------------------------------------------
#
# An operation's tensors are kept as ``(shape, dtype)`` pairs (``torch.Size`` is an
# immutable tuple, so a tensor resized later does not change what was recorded) in a
# tagged tuple: ``(_ONE, shape, dtype)`` for one tensor, ``(_STACK, pairs)`` for a per-rank
# list that c10d reports as one stacked shape when uniform, ``(_EACH, pairs)`` for tensors
# reported one by one, ``None`` for no tensor. ``dump._render`` makes c10d's lists at dump.

_ONE, _STACK, _EACH = 0, 1, 2
#: The tag of a description already in c10d's form: ``(RENDERED, sizes, dtypes)`` for
#: tensors, ``(RENDERED, frames)`` for a stack; the c10d bridge's engine lane
#: (``c10d.recorder_lane``) builds them from c10d's own records.
RENDERED = 3
_Desc = tuple[Any, ...] | None
_Tensor = torch.Tensor
# Operations whose one ``tensor`` c10d reports as both input and output.
_ONE_TENSOR_OPS = frozenset({"all_reduce", "broadcast", "reduce", "send", "recv"})


def _pairs(values: Any) -> tuple[tuple[torch.Size, torch.dtype], ...]:
    return tuple((t.shape, t.dtype) for t in values if isinstance(t, _Tensor))


def _desc(op: str, value: Any) -> _Desc:
    if isinstance(value, _Tensor):
        return (_ONE, value.shape, value.dtype)
    if isinstance(value, (list, tuple)):
        return (_EACH if op == "all_to_all" else _STACK, _pairs(value))
    return None


def _io(op: str, fields: dict[str, Any]) -> tuple[_Desc, _Desc]:
    """``(input, output)`` descriptions of one operation's tensors, as they are now.

    The in-place operations and send/recv return the same object twice (c10d reports
    one tensor as both input and output).
    """
    if op in _ONE_TENSOR_OPS:
        t = fields.get("tensor")
        one = (_ONE, t.shape, t.dtype) if isinstance(t, _Tensor) else None
        return one, one
    inp, out = _args.raw_io(op, fields)
    if inp is None and out is None:
        pairs = _pairs(fields.values())
        return (_EACH, pairs), (_EACH, pairs)
    # One tensor each way is the common case: described inline.
    return (
        (_ONE, inp.shape, inp.dtype) if isinstance(inp, _Tensor) else _desc(op, inp),
        (_ONE, out.shape, out.dtype) if isinstance(out, _Tensor) else _desc(op, out),
    )


# The caller's stack is captured by torch's C++ traceback gatherer (code objects and
# instruction offsets, no frame objects, so no tensor of the caller is kept alive) and
# symbolized at dump time (``dump._frame_lists``), where torchcomms' own frames are left
# out. torch's symbolizer imports torch._inductor the first time it runs (to map compiled
# code to its source), so a process's first dump takes a second or so longer unless
# torch.compile was used.
try:
    from torch._C._profiler import gather_traceback as _gather_traceback
except ImportError:  # pragma: no cover - torch builds without the profiler bindings
    _gather_traceback = None  # type: ignore[assignment]


def _walk_stack() -> list[tuple[str, str, int]]:
    """The stack as ``(name, filename, line)``, innermost first, without our frames."""
    out: list[tuple[str, str, int]] = []
    frame: FrameType | None = sys._getframe(1)
    here = _HERE
    while frame is not None and len(out) < _MAX_FRAMES:
        code = frame.f_code
        if not code.co_filename.startswith(here):
            out.append((code.co_name, code.co_filename, frame.f_lineno))
        frame = frame.f_back
    return out


def _frames() -> Any:
    """The caller's Python stack, cheaply; ``dump._frame_lists`` makes c10d's frames of it."""
    if _gather_traceback is not None:
        return _gather_traceback(True, False, False)
    return _walk_stack()


# Operation names as hooks pass them (``OpName`` members, or a plugin collective's
# name) -> the plain names recorded.
_OP_NAMES: dict[Any, str] = {}


def _op_str(name: Any) -> str:
    op = _OP_NAMES.get(name)
    if op is None:
        op = str(getattr(name, "name", name))
        if len(_OP_NAMES) < 1024:
            _OP_NAMES[name] = op
    return op


# An entry, as recorded: a list (cheapest to build) with these fields. Dumps turn it into
# c10d's dict; the profiling name, sizes, dtypes, frames and timeout are made then.
(
    _RECORD_ID,
    _TRACK,
    _COLLECTIVE_SEQ,
    _P2P_SEQ,
    _OP_SEQ,
    _KIND,  # the operation ("send", "all_reduce", ...)
    _ME,  # this rank, for send/recv labels
    _PEER,  # the peer of a send/recv
    _CREATED,
    _INPUT,  # descriptions of the tensors (see _io)
    _OUTPUT,
    _STATE,
    _STARTED,
    _COMPLETED,
    _RETIRED,
    _TIMEOUT,  # a timedelta, or None
    _IS_P2P,
    _THREAD_ID,  # an int
    _THREAD_NAME,  # a str, or the threading.Thread (engine-lane entries)
    _FRAMES,  # what _frames returned, or (RENDERED, c10d's frames): c10d.recorder_lane
    _WORK,  # the operation's work until it is seen finished
    _ALGORITHM,  # the algorithm the backend chose (a str), or None (#45)
) = range(22)


def _created(entry: list[Any]) -> int:
    created: int = entry[_CREATED]
    return created
