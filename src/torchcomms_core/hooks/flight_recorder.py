"""``FlightRecorderHook``: a ring buffer of a communicator's last operations, dumped as c10d does.

Dumps use the fields of c10d's own flight recorder, so PyTorch's analyzer
(``torch.distributed.flight_recorder``) can match operations across ranks. Hooks share
one process-wide recorder unless made ``isolated``, as in Meta's torchcomms.

Recording runs on every operation, so it keeps raw values only (shapes, dtypes, a stack
captured in C++, counters); dumps turn them into c10d's dicts.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import datetime
import functools
import heapq
import itertools
import json
import os
import pickle
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from types import FrameType
from typing import Any

import torch

from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.foundation.work import TorchWork, WorkStatus
from torchcomms_core.hooks import _args
from torchcomms_core.operations.args import reset_op_ids
from torchcomms_core.plugin_host.hookspecs import hookimpl
from torchcomms_core.plugin_host.manager import get_plugin_manager


def _undescribed(comm: TorchComm) -> tuple[str, str, list[int] | None]:
    return comm.get_name(), "undefined", None


# ``(group name, description, global ranks or None)`` of a communicator as torch.distributed
# knows it. The c10d bridge, the only way a communicator becomes a c10d group, installs its
# lookup when it loads (``set_group_describer``); without it no group exists to describe.
_describe: Callable[[TorchComm], tuple[str, str, list[int] | None]] = _undescribed


def set_group_describer(describe: Callable[[TorchComm], tuple[str, str, list[int] | None]]) -> None:
    """Name dumped groups with ``describe(comm)`` (the c10d bridge installs its lookup)."""
    global _describe
    _describe = describe


#: The c10d flight-recorder format version our dumps follow.
VERSION = "2.10"

# Analyzer operation names for ours where they differ.
_PROFILING_NAMES = {"gather_single": "gather"}
_SCALAR_NAMES = {
    torch.float32: "Float",
    torch.float64: "Double",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}
_MAX_FRAMES = 32
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Recorders attached to each communicator, so communicators split from it (process groups
# that torch.distributed splits included) are recorded too (weak: a dead comm needs none).
_attached: weakref.WeakKeyDictionary[TorchComm, list[FlightRecorderHook]] = (
    weakref.WeakKeyDictionary()
)


class _SplitFollower:
    """Lifecycle observer: a split child joins every recorder of its parent."""

    @hookimpl
    def torchcomms_comm_created(self, comm: TorchComm, parent: TorchComm | None) -> None:
        for recorder in list(_attached.get(parent, ())) if parent is not None else ():
            recorder.register_with_comm(comm)


_follower = _SplitFollower()


def _follow_splits() -> None:
    pm = get_plugin_manager()
    if not pm.is_registered(_follower):
        pm.register(_follower, name="torchcomms-flight-recorder")


def _scalar_name(dtype: torch.dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype).replace("torch.", ""))


# -- recording: compact, taken at record time ---------------------------------------------
#
# An operation's tensors are kept as ``(shape, dtype)`` pairs (``torch.Size`` is an
# immutable tuple, so a tensor resized later does not change what was recorded) in a
# tagged tuple: ``(_ONE, shape, dtype)`` for one tensor, ``(_STACK, pairs)`` for a per-rank
# list that c10d reports as one stacked shape when uniform, ``(_EACH, pairs)`` for tensors
# reported one by one, ``None`` for no tensor. :func:`_render` makes c10d's lists at dump.

_ONE, _STACK, _EACH, _RENDERED = 0, 1, 2, 3
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


def _render(desc: _Desc) -> tuple[list[list[int]], list[str]]:
    """c10d's ``(sizes, dtypes)`` of a description made by :func:`_io`."""
    if desc is None:
        return [], []
    if desc[0] == _ONE:
        return [list(desc[1])], [_scalar_name(desc[2])]
    if desc[0] == _RENDERED:  # c10d's own, for the engine lane (see _lane_entries)
        return [list(sizes) for sizes in desc[1]], list(desc[2])
    pairs = desc[1]
    if desc[0] == _STACK and pairs and len({shape for shape, _ in pairs}) == 1:
        return [[len(pairs), *pairs[0][0]]], [_scalar_name(pairs[0][1])]
    return [list(shape) for shape, _ in pairs], [_scalar_name(dtype) for _, dtype in pairs]


# The caller's stack is captured by torch's C++ traceback gatherer (code objects and
# instruction offsets, no frame objects, so no tensor of the caller is kept alive) and
# symbolized at dump time, where torchcomms' own frames are left out. torch's symbolizer
# imports torch._inductor the first time it runs (to map compiled code to its source),
# so a process's first dump takes a second or so longer unless torch.compile was used.
try:
    from torch._C._profiler import gather_traceback as _gather_traceback
    from torch._C._profiler import symbolize_tracebacks as _symbolize_tracebacks
except ImportError:  # pragma: no cover - torch builds without the profiler bindings
    _gather_traceback = None  # type: ignore[assignment]
    _symbolize_tracebacks = None  # type: ignore[assignment]


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
    """The caller's Python stack, cheaply; :func:`_frame_lists` makes c10d's frames of it."""
    if _gather_traceback is not None:
        return _gather_traceback(True, False, False)
    return _walk_stack()


def _frame_lists(captured: list[Any]) -> list[list[dict[str, Any]]]:
    """c10d's ``frames`` (innermost first, at most 32, without torchcomms' own frames) of
    each stack :func:`_frames` returned."""
    if _symbolize_tracebacks is None:
        return [[{"name": n, "filename": f, "line": ln} for n, f, ln in c] for c in captured]
    return [_kept_frames(frames) for frames in _symbolize_tracebacks(captured)]


def _kept_frames(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """c10d's ``frames`` of a symbolized stack: at most 32, without torchcomms' own."""
    here = _HERE
    kept = []
    for frame in frames:
        filename = frame["filename"]
        if not filename.startswith(here):
            kept.append({"name": frame["name"], "filename": filename, "line": frame["line"]})
            if len(kept) == _MAX_FRAMES:
                break
    return kept


# -- the c10d bridge's engine lane, recorded by c10d ---------------------------------
#
# A c10d engine (``ProcessGroupGloo``) records each operation it is given into c10d's
# own flight recorder: shapes, dtypes, the caller's Python stack, the creation time, and
# ``retired`` once the operation finished. When the c10d bridge hands a call to such an
# engine directly (its engine lane), recording it again here would be the whole cost of
# recording. The lane then logs, per call, only its index, the operation's name and the
# engine's operation id (a ``_Lane``); a dump joins that log with c10d's records of the
# engine, which the bridge names after the group (``lane_tags``), and numbers the calls
# among the entries recorded here (see ``_Lane.numbers``).


def c10d_recorder_size() -> int:
    """The size of c10d's own flight recorder, as c10d reads it (``TORCH_FR_BUFFER_SIZE``,
    else ``TORCH_NCCL_TRACE_BUFFER_SIZE``, else 2000); 0 when it records nothing or the
    value is not an integer (c10d would refuse it)."""
    for name in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"):
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                return max(0, int(raw))
            except ValueError:
                return 0
    return 2000


def _c10d_entries(stacks: bool) -> list[dict[str, Any]]:
    """c10d's recorded operations (every group's), oldest first; none without a recorder."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]

        trace = pickle.loads(_dump_fr_trace(True, stacks, False))
    except Exception:  # noqa: BLE001 - no c10d recorder here: nothing recorded there
        return []
    return list(trace.get("entries", ()))


class _Lane:
    """The engine lane of one recorded communicator, whose operations c10d records.

    ``log`` holds ``(index, operation, engine op id)`` of the last calls (``index`` counts
    the lane's calls from 1). ``marks`` holds, before each entry recorded here on the same
    track, ``(lane calls so far, collective, p2p and op counters)``: the lane's calls and
    those entries share one numbering, as if every call had been recorded here.
    """

    __slots__ = ("engine", "log", "counter", "tags", "floor", "marks", "first")

    def __init__(self, engine: Any, size: int) -> None:
        # Weakly: a recorder keeps its tracks after their communicator finalized.
        self.engine = weakref.ref(engine)
        self.log: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=size)
        self.counter = itertools.count(1)
        # The names c10d's records of the engine carry (the group's, as it was renamed).
        self.tags: set[str] = set()
        # Calls up to ``floor`` were dropped by a reset; up to ``first``, cannot be
        # numbered any more (the marks after them were let go).
        self.floor = 0
        self.first = 0
        self.marks: collections.deque[tuple[int, int, int, int]] = collections.deque(maxlen=size)

    def calls(self) -> int:
        """How many calls took the lane so far."""
        log = self.log
        return log[-1][0] if log else self.floor

    def mark(self, track: _Track) -> int:
        """Before an entry is recorded here on ``track`` (the lock is held): note where
        it falls among the lane's calls, which it returns."""
        before = self.calls()
        marks = self.marks
        if len(marks) == marks.maxlen:
            self.first = max(self.first, marks[0][0])
        marks.append((before, track.collective_seq, track.p2p_seq, track.recorder.op_seq))
        return before

    def numbers(self, index: int, track: _Track) -> tuple[int, int, int] | None:
        """``(collective, p2p, op)`` sequence numbers of the lane's call ``index``: the
        counters before the first entry recorded after it, plus ``index``."""
        if index <= self.first:
            return None
        marks = self.marks
        at = bisect.bisect_left(marks, (index,))
        if at < len(marks):
            _, coll, p2p, op = marks[at]
        else:
            coll, p2p, op = track.collective_seq, track.p2p_seq, track.recorder.op_seq
        return coll + index, p2p, op + index


# c10d's names of what the engine ran, for the lane's operations whose record differs
# from ours: gloo records a reduce-scatter as the all-reduce it runs, and an all-gather's
# output as the stack of the ranks' inputs.
def _lane_sizes(kind: str, c10d: dict[str, Any], size: int) -> tuple[Any, Any]:
    inp = (_RENDERED, c10d.get("input_sizes") or [], c10d.get("input_dtypes") or [])
    out_sizes = c10d.get("output_sizes") or []
    out_types = c10d.get("output_dtypes") or []
    if kind == "all_gather_single" and len(out_sizes) == 1 and len(out_sizes[0]) >= 2:
        n, first, *rest = out_sizes[0]
        out_sizes = [[n * first, *rest]]
    elif kind == "reduce_scatter_single" and len(inp[1]) == 1 and inp[1][0] and size > 0:
        first, *rest = inp[1][0]
        out_sizes, out_types = [[first // size, *rest]], list(inp[2])
    return inp, (_RENDERED, out_sizes, out_types)


def _lane_entries(tracks: list[_Track], stacks: bool) -> list[list[Any]]:
    """The engine lanes' calls of ``tracks`` as entries, from c10d's records of them."""
    lanes = [(t, t.lane) for t in tracks if t.lane is not None and t.lane.log]
    if not lanes:
        return []
    by_tag = _by_tag(_c10d_entries(stacks))
    _settle_retired(by_tag, {tag for _, lane in lanes for tag in lane.tags})
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    out: list[list[Any]] = []
    for track, lane in lanes:
        comm = track.comm()
        size = comm.get_size() if comm is not None else 0
        records: dict[int, dict[str, Any]] = {}
        for tag in lane.tags:
            records.update(by_tag.get(tag, {}))
        for index, kind, op_id in list(lane.log):
            found = records.get(op_id)
            if found is None or index <= lane.floor:
                continue  # c10d's ring moved on, or a reset dropped it
            record = found
            numbers = lane.numbers(index, track)
            if numbers is None:
                continue
            retired = bool(record.get("retired"))
            created = int(record.get("time_created_ns") or 0)
            thread_id = int(record.get("thread_id") or 0)
            inp, outp = _lane_sizes(kind, record, size)
            timeout_ms = record.get("timeout_ms")
            out.append(
                [
                    0,  # numbered with the others when dumped
                    track,
                    *numbers,
                    kind,
                    None,
                    None,
                    created,
                    inp,
                    outp,
                    "completed" if retired else "started",
                    created,
                    None,  # c10d's gloo records no completion time
                    retired,
                    datetime.timedelta(milliseconds=timeout_ms) if timeout_ms else None,
                    False,
                    thread_id,
                    names.get(thread_id, record.get("thread_name") or ""),
                    (_RENDERED, record.get("frames") or []),
                    None,
                ]
            )
    return out


def engine_lane(track: _Track, engine: Any, tags: set[str]) -> _Lane:
    """``track``'s engine lane for ``engine``, whose records in c10d's recorder carry one
    of ``tags`` (the set is shared: names added later count)."""
    lane = track.lane
    if lane is None or lane.engine() is not engine:
        lane = track.lane = _Lane(engine, max(c10d_recorder_size(), 1))
    lane.tags = tags
    return lane


def _by_tag(records: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """c10d's records by group name, then by operation id."""
    by_tag: dict[str, dict[int, dict[str, Any]]] = {}
    for record in records:
        group = record.get("process_group") or ("",)
        by_tag.setdefault(str(group[0]), {})[int(record.get("op_id", -1))] = record
    return by_tag


# gloo marks an operation finished (its waiter returns) before it retires the operation's
# record, on its own thread: a dump taken right after a call can find it not yet retired.
_RETIRE_WAITS_S = (0.002, 0.004, 0.008, 0.016, 0.032)


def _settle_retired(by_tag: dict[str, dict[int, dict[str, Any]]], tags: set[str]) -> None:
    """Read c10d's records again, briefly, while operations of ``tags`` still retire."""
    for pause in _RETIRE_WAITS_S:
        open_ = {(t, i) for t in tags for i, r in by_tag.get(t, {}).items() if not r.get("retired")}
        if not open_:
            return
        time.sleep(pause)
        again = _by_tag(_c10d_entries(False))
        retired = {(t, i) for t, i in open_ if again.get(t, {}).get(i, {}).get("retired")}
        for t, i in retired:
            by_tag[t][i]["retired"] = True
        if not retired:
            return  # in flight indeed (a hung operation stays so)


def lane_tags(engine: Any, tag: str) -> bool:
    """Claim ``tag`` (a group name c10d's records of ``engine`` carry) for ``engine``:
    False when a live engine of another communicator holds it (records would mix)."""
    holder = _tag_holders.get(tag)
    held = holder() if holder is not None else None
    if held is not None and held is not engine:
        return False
    for dead in [t for t, ref in _tag_holders.items() if ref() is None]:
        del _tag_holders[dead]
    _tag_holders[tag] = weakref.ref(engine)
    return True


_tag_holders: dict[str, weakref.ref[Any]] = {}


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


class _Track:
    """What a recorder knows of one communicator: its id, counters, open entries, hooks."""

    __slots__ = (
        "recorder",
        "pg_id",
        "comm",
        "backend",
        "collective_seq",
        "p2p_seq",
        "open",
        "lane_open",
        "lane",
        "handles",
    )

    def __init__(self, recorder: _Recorder, pg_id: int, comm: TorchComm) -> None:
        self.recorder = recorder
        self.pg_id = pg_id
        self.comm = weakref.ref(comm)
        self.backend = comm.get_backend()
        self.collective_seq = 0
        self.p2p_seq = 0
        self.open: dict[int, list[list[Any]]] = {}
        # Entries of the bridge's engine lane whose work was not seen finished yet.
        self.lane_open: list[list[Any]] = []
        # The engine lane c10d records for us, once the c10d bridge asked for one.
        self.lane: _Lane | None = None
        self.handles: list[RemovableHandle] = []

    def remove(self) -> None:
        # Out of the lane table first: removing the hooks tells the c10d bridge to look
        # again, and it must no longer find this track.
        comm = self.comm()
        if comm is not None and _lane_tracks.get(id(comm)) is self:
            del _lane_tracks[id(comm)]
        for handle in self.handles:
            handle.remove()
        self.handles = []


# Each thread's ``threading.Thread``, for the engine lane's entries (a thread-local read
# costs a third of ``threading.current_thread()``). Those entries keep the thread and
# dumps read its name (as much again as the rest of the entry, when recording).
_this_thread = threading.local()


def _thread_name(thread: threading.Thread | str) -> str:
    return thread if isinstance(thread, str) else thread.name


# Asynchronous engine-lane entries whose work is kept to settle them, per communicator.
_LANE_OPEN = 64
# Unregistered communicators whose engine-lane calls a recorder still dumps.
_DROPPED_LANES = 64

# The track of each communicator that one recorder records (by ``id``; the track's weak
# reference tells a reused id apart), for the c10d bridge's engine lane: see lane_track.
_lane_tracks: dict[int, _Track] = {}


def lane_track(comm: TorchComm) -> _Track | None:
    """The track recording ``comm``, when a flight recorder's hooks are its only hooks'
    reason to exist (the caller still checks that no other hooks are registered)."""
    track = _lane_tracks.get(id(comm))
    if track is not None and track.comm() is comm:
        return track
    return None


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
    _FRAMES,  # what _frames returned, or (_RENDERED, c10d's frames): see _lane_entries
    _WORK,  # the operation's work until it is seen finished
) = range(21)


def _created(entry: list[Any]) -> int:
    created: int = entry[_CREATED]
    return created


def _profiling_name(entry: list[Any]) -> str:
    kind = entry[_KIND]
    if kind == "send":
        label = f"send {entry[_ME]}->{entry[_PEER]}"
    elif kind == "recv":
        label = f"recv {entry[_ME]}<-{entry[_PEER]}"
    else:
        label = _PROFILING_NAMES.get(kind, kind)
    return f"{entry[_TRACK].backend}:{label}"


class _Recorder:
    """A ring buffer of operations and the communicators that feed it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: collections.deque[list[Any]] = collections.deque(maxlen=max_entries or None)
        self.tracks: list[_Track] = []
        # Tracks no longer recording whose engine lane still has calls to dump (their
        # other entries stay in ``entries``, as every track's do).
        self.dropped: collections.deque[_Track] = collections.deque(maxlen=_DROPPED_LANES)
        self.next_pg_id = 0
        self.record_ids = 0
        # Operation ids (``op_id`` of the entries): one sequence over every communicator
        # of this recorder, as the reference numbers operations (c10d numbers them per
        # group; its analyzer reads the per-group collective and p2p ids, not this).
        self.op_seq = 0
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def find(self, comm: TorchComm) -> _Track | None:
        return next((t for t in self.tracks if t.comm() is comm), None)

    def add(self, comm: TorchComm) -> _Track:
        track = _Track(self, self.next_pg_id, comm)
        self.next_pg_id += 1
        _lane_tracks[id(comm)] = track
        track.handles = [
            comm.register_pre_hook(functools.partial(self.pre, track)),
            comm.register_post_hook(functools.partial(self.post, track)),
        ]
        self.tracks.append(track)
        return track

    def drop(self, track: _Track) -> None:
        track.remove()
        if track in self.tracks:
            self.tracks.remove(track)
            if track.lane is not None and track.lane.log:
                self.dropped.append(track)

    def reset(self) -> None:
        with self.lock:
            self.entries.clear()
            self.record_ids = 0
            for track in self.tracks:
                track.open.clear()
                track.lane_open = []
                if track.lane is not None:
                    track.lane.floor = track.lane.calls()
            self.dropped.clear()

    # -- recording -------------------------------------------------------------------

    def pre(self, track: _Track, name: Any, op_id: int, args: Any) -> None:
        op = _OP_NAMES.get(name) or _op_str(name)
        if op == "finalize":
            # Not an operation between ranks: as in the reference (hook id 2**64 - 1), it
            # takes no id, and no entry that would advance the group's sequence numbers.
            return
        now = time.time_ns()
        frames = _frames()
        timeout = getattr(args, "timeout", None)
        comm = track.comm()
        if timeout is None and comm is not None:
            timeout = comm.get_timeout()
        thread_id = threading.get_ident()
        thread_name = threading.current_thread().name
        fields = _args.fields(args)
        if op == "batch_op_issue":
            batch = _args.batch_ops(args)
            if batch is not None:
                self._record_batch(
                    track, op_id, batch, comm, now, timeout, thread_id, thread_name, frames
                )
                return
        inp, out = _io(op, fields)
        p2p = op in ("send", "recv", "batch_op_issue")
        me = peer = None
        if op == "send" or op == "recv":
            me = comm.get_rank() if comm is not None else -1
            peer = _args.peer(fields)
        with self.lock:
            lane = track.lane.mark(track) if track.lane is not None else 0
            if p2p:
                track.p2p_seq += 1
            else:
                track.collective_seq += 1
            entry = self._append(
                track,
                op,
                me,
                peer,
                now,
                inp,
                out,
                timeout,
                p2p,
                thread_id,
                thread_name,
                frames,
                lane,
            )
            track.open[op_id] = [entry]

    def _append(
        self,
        track: _Track,
        op: str,
        me: int | None,
        peer: int | None,
        now: int,
        inp: Any,
        out: Any,
        timeout: Any,
        p2p: bool,
        thread_id: int,
        thread_name: str,
        frames: Any,
        lane: int = 0,
    ) -> list[Any]:
        """A new scheduled entry (fields in the order of ``_RECORD_ID`` ... ``_WORK``), kept;
        the caller holds the lock and has advanced the track's sequence ids. ``lane``: the
        engine lane's calls before it (see ``_Lane``), which its collective and operation
        numbers count too."""
        self.op_seq += 1
        entry = [
            self.record_ids,
            track,
            track.collective_seq + lane,
            track.p2p_seq,
            self.op_seq + lane,
            op,
            me,
            peer,
            now,
            inp,
            out,
            "scheduled",
            0,
            0,
            False,
            timeout,
            p2p,
            thread_id,
            thread_name,
            frames,
            None,
        ]
        self.record_ids += 1
        self.entries.append(entry)
        return entry

    def _record_batch(
        self,
        track: _Track,
        op_id: int,
        batch: list[tuple[str, Any, Any]],
        comm: TorchComm | None,
        now: int,
        timeout: Any,
        thread_id: int,
        thread_name: str,
        frames: Any,
    ) -> None:
        """One entry per send/recv of a batch, sharing one point-to-point sequence id as
        c10d's coalesced groups do."""
        me = comm.get_rank() if comm is not None else -1
        ios = [_io(kind, {"tensor": t}) for kind, t, _ in batch]
        entries = []
        with self.lock:
            lane = track.lane.mark(track) if track.lane is not None else 0
            track.p2p_seq += 1
            for (kind, _, peer), (inp, out) in zip(batch, ios, strict=True):
                entries.append(
                    self._append(
                        track,
                        kind,
                        me,
                        peer,
                        now,
                        inp,
                        out,
                        timeout,
                        True,
                        thread_id,
                        thread_name,
                        frames,
                        lane,
                    )
                )
            track.open[op_id] = entries

    def post(self, track: _Track, op_id: int, args: Any) -> None:
        entries = track.open.pop(op_id, None)
        if not entries:
            return
        now = time.time_ns()
        work = getattr(args, "work", None)
        # A synchronous operation has completed by now: its work is not kept.
        done = work is not None and work.status is WorkStatus.COMPLETED
        for entry in entries:
            entry[_STARTED] = now
            if done:
                entry[_COMPLETED] = now
                entry[_RETIRED] = True
                entry[_STATE] = "completed"
            else:
                entry[_WORK] = work
                entry[_STATE] = "started"
                self.settle(entry, now)

    def record_lane(
        self,
        track: _Track,
        op: str,
        inp: _Tensor | None,
        out: _Tensor | None,
        work: Any,
        timeout: Any,
        created: int,
        done: bool,
    ) -> None:
        """Record an operation the c10d bridge gave its engine directly, as :meth:`pre`
        and :meth:`post` would have: one entry. ``done``: the bridge waited for it (a
        synchronous call) and it completed; else it is started and settled from ``work``
        (the engine's c10d ``Work``) when read. ``inp``/``out``: its one tensor each way
        (the same object for in-place operations), or ``None``; ``created``: when it was
        issued (``time.time_ns()``). The bridge records here when c10d cannot record the
        call for it (see ``_Lane``)."""
        now = time.time_ns()
        frames = _frames()
        one_in = (_ONE, inp.shape, inp.dtype) if inp is not None else None
        one_out = (
            one_in if out is inp else (_ONE, out.shape, out.dtype) if out is not None else None
        )
        try:
            thread = _this_thread.thread
        except AttributeError:
            thread = _this_thread.thread = threading.current_thread()
        thread_id = threading.get_ident()
        # This runs on every call the bridge records: _append's entry is written out, and
        # the lock taken without a with block (a third of the cost, here).
        lock = self.lock
        lock.acquire()
        try:
            lane = track.lane.mark(track) if track.lane is not None else 0
            track.collective_seq += 1
            self.op_seq += 1
            entry = [
                self.record_ids,
                track,
                track.collective_seq + lane,
                track.p2p_seq,
                self.op_seq + lane,
                op,
                None,
                None,
                created,
                one_in,
                one_out,
                "completed" if done else "started",
                created,
                now if done else 0,
                done,
                timeout,
                False,
                thread_id,
                thread,  # its name is read when dumping
                frames,
                None,
            ]
            self.record_ids += 1
            self.entries.append(entry)
            if done:
                return
            self._open_lane(track, entry, work, now)
        finally:
            lock.release()

    def _open_lane(self, track: _Track, entry: list[Any], work: Any, now: int) -> None:
        """Keep an asynchronous lane entry's work to settle it from (the lock is held)."""
        entry[_WORK] = work
        # Settle the earlier ones now, so that no finished work (nor the tensors it
        # holds) stays referenced until a dump. Some engine works never say they
        # completed (gloo's _reduce_scatter_base): past _LANE_OPEN of them, the oldest
        # is let go, still "started".
        still = track.lane_open
        if still:
            for earlier in still:
                self.settle(earlier, now)
            still = [e for e in still if e[_WORK] is not None]
            if len(still) >= _LANE_OPEN:
                oldest = still.pop(0)
                oldest[_WORK] = None
                oldest[_RETIRED] = True
        still.append(entry)
        track.lane_open = still

    @staticmethod
    def settle(entry: list[Any], now: int) -> None:
        """Update a started entry from its work; drop the work once it is finished."""
        work = entry[_WORK]
        if work is None:
            return
        if not isinstance(work, TorchWork):  # an engine's c10d Work (record_lane)
            if work.is_completed():
                failed = work.exception() is not None
                entry[_STATE] = "started" if failed else "completed"
                entry[_RETIRED] = True
                entry[_COMPLETED] = 0 if failed else now
                entry[_WORK] = None
            return
        status = work.status
        if status is WorkStatus.COMPLETED:
            entry[_STATE] = "completed"
            entry[_RETIRED] = True
            entry[_COMPLETED] = now
            entry[_WORK] = None
        elif status is not WorkStatus.INPROGRESS:
            entry[_RETIRED] = True
            entry[_WORK] = None

    # -- dumping ---------------------------------------------------------------------

    def held(self, stacks: bool = False) -> tuple[list[list[Any]], list[_Track]]:
        """The entries held now, oldest first, the engine lanes' among them (see
        ``_Lane``), at most ``max_entries``; and the tracks."""
        with self.lock:
            entries = list(self.entries)
            tracks = list(self.tracks)
            dropped = list(self.dropped)
            total = self.record_ids
        lane = _lane_entries(tracks + dropped, stacks)
        if not lane:
            return entries, tracks
        now = time.time_ns()
        for entry in entries:  # settled here: the copies below are what is dumped
            self.settle(entry, now)
        for track in tracks + dropped:
            if track.lane is not None:
                total += track.lane.calls() - track.lane.floor
        lane.sort(key=_created)
        merged = list(heapq.merge(entries, lane, key=_created))
        if self.max_entries > 0:
            merged = merged[-self.max_entries :]
        # One numbering for both kinds, as one ring of every call would have held.
        first = max(total - len(merged), 0)
        for i, entry in enumerate(merged):
            entry = merged[i] = list(entry)
            entry[_RECORD_ID] = first + i
        return merged, tracks

    def size(self) -> int:
        """Entries held now (at most ``max_entries``)."""
        return len(self.held()[0])

    def dump_dict(self, include_completed: bool = True) -> dict[str, Any]:
        now = time.time_ns()
        entries, tracks = self.held(stacks=True)
        groups: dict[int, tuple[str, str, Any]] = {}
        pg_config: dict[str, dict[str, str]] = {}
        pg_status: dict[str, dict[str, int]] = {}
        for track in tracks:
            comm = track.comm()
            if comm is None:
                continue
            name, desc, ranks = _describe(comm)
            if ranks is None:
                ranks = _fallback_ranks(comm)
            groups[track.pg_id] = (name, desc, ranks)
            pg_config[name] = {"name": name, "desc": desc, "ranks": ranks_str(ranks)}
        kept = []
        for entry in entries:
            self.settle(entry, now)
            state = entry[_STATE]
            if not entry[_IS_P2P]:
                status = pg_status.setdefault(
                    str(entry[_TRACK].pg_id),
                    {
                        "last_enqueued_collective": -1,
                        "last_started_collective": -1,
                        "last_completed_collective": -1,
                    },
                )
                seq = entry[_COLLECTIVE_SEQ]
                status["last_enqueued_collective"] = seq
                if state in ("started", "completed"):
                    status["last_started_collective"] = seq
                if state == "completed":
                    status["last_completed_collective"] = seq
            if include_completed or state != "completed":
                kept.append(entry)
        # Our own stacks, and those c10d recorded of the engine lanes' calls.
        frames: list[list[dict[str, Any]]] = [[] for _ in kept]
        own = []
        for i, entry in enumerate(kept):
            captured = entry[_FRAMES]
            if type(captured) is tuple and captured and captured[0] == _RENDERED:
                frames[i] = _kept_frames(captured[1])
            else:
                own.append(i)
        for i, stack in zip(own, _frame_lists([kept[i][_FRAMES] for i in own]), strict=True):
            frames[i] = stack
        out = []
        for entry, entry_frames in zip(kept, frames, strict=True):
            pg_id = entry[_TRACK].pg_id
            inp, outp = entry[_INPUT], entry[_OUTPUT]
            in_sizes, in_types = _render(inp)
            out_sizes, out_types = (in_sizes, in_types) if outp is inp else _render(outp)
            timeout = entry[_TIMEOUT]
            name, desc, _ = groups.get(pg_id, (str(pg_id), "undefined", []))
            record: dict[str, Any] = {
                "record_id": entry[_RECORD_ID],
                "pg_id": pg_id,
                "collective_seq_id": entry[_COLLECTIVE_SEQ],
                "p2p_seq_id": entry[_P2P_SEQ],
                "op_id": entry[_OP_SEQ],
                "profiling_name": _profiling_name(entry),
                "time_created_ns": entry[_CREATED],
                "input_sizes": in_sizes,
                "input_dtypes": in_types,
                "output_sizes": out_sizes,
                "output_dtypes": out_types,
                "state": entry[_STATE],
                "time_discovered_started_ns": entry[_STARTED],
                "time_discovered_completed_ns": entry[_COMPLETED],
                "retired": entry[_RETIRED],
                "timeout_ms": (int(timeout.total_seconds() * 1000) if timeout is not None else 0),
                "is_p2p": entry[_IS_P2P],
                "thread_id": str(entry[_THREAD_ID]),
                "thread_name": _thread_name(entry[_THREAD_NAME]),
                "frames": entry_frames,
                "process_group": [name, desc],
            }
            if entry[_STATE] == "completed" and entry[_COMPLETED] is not None:
                # c10d writes the field only once an operation completed (from its CUDA
                # events); here from the call to the completion the recorder saw.
                record["duration_ms"] = max(entry[_COMPLETED] - entry[_CREATED], 0) / 1e6
            out.append(record)
        return {
            "version": VERSION,
            "comm_lib_version": "",
            "pg_config": pg_config,
            "pg_status": pg_status,
            "nccl_comm_state": {},
            "entries": out,
        }


# The process-wide recorder every non-isolated hook shares (made on first use), and
# whether this process is still healthy (a failed operation under a recorder says no).
_global: _Recorder | None = None
_global_lock = threading.Lock()
_health = {"healthy": True}


def global_recorder() -> _Recorder:
    """The process-wide recorder, sized by ``TORCHCOMM_FR_BUFFER_SIZE`` when first made."""
    global _global
    with _global_lock:
        if _global is None:
            try:
                size = _env.fr_buffer_size()
                _env.fr_cpp_stack()  # validated; Python engines have no C++ stacks to record
            except ValueError as exc:
                raise CommInputError(f"FlightRecorderHook: {exc}") from None
            _global = _Recorder(size)
        return _global


def global_recorder_in_use() -> bool:
    """Whether a communicator was ever registered with the process-wide recorder."""
    recorder = _global
    return recorder is not None and recorder.next_pg_id > 0


def is_healthy() -> bool:
    """False once an operation failed on a communicator a flight recorder watches."""
    return _health["healthy"]


def _set_healthy(value: bool) -> None:
    _health["healthy"] = value


def _check_max_entries(max_entries: Any) -> int:
    if isinstance(max_entries, bool) or not isinstance(max_entries, int):
        raise CommTypeError(f"FlightRecorderHook: max_entries must be an int, got {max_entries!r}")
    if max_entries < 0:
        raise CommInputError(f"FlightRecorderHook: max_entries must be >= 0, got {max_entries}")
    return max_entries


class FlightRecorderHook:
    """Record the last operations of the communicators it is registered with.

    As in Meta's torchcomms, ``isolated=False`` (the default) records into the
    process-wide recorder, whose size is ``TORCHCOMM_FR_BUFFER_SIZE`` (2000; ``<= 0``
    disables it) and not ``max_entries``; every such hook shares its entries, and the
    debug handlers (``torchcomms_fr_trace_json``, ``torchcomms_fr_dump_file``) read it.
    ``isolated=True`` gives this hook a private recorder of ``max_entries`` entries
    (``0`` records nothing), numbered from 0.

    ``dump_json()`` returns c10d's trace layout; ``dump_file(rank)`` writes it as c10d
    does (pickle) to ``$TORCHCOMM_FR_DUMP_TEMP_FILE<rank>`` (by default
    ``~/.cache/torch/comm_lib_trace_rank_<rank>``, mode 0600), readable by
    ``python -m torch.distributed.flight_recorder.fr_trace``. A failed, timed-out or
    aborted operation writes ``dump()`` (JSON) by itself; a failure also marks the
    process unhealthy for ``torchcomms_health_check`` and, when the process is about to
    abort, waits ``TORCHCOMM_HEALTH_CHECK_WAIT_MS`` so a debug server can collect dumps.
    """

    def __init__(self, max_entries: int = 2048, isolated: bool = False) -> None:
        max_entries = _check_max_entries(max_entries)
        if not isinstance(isolated, bool):
            raise CommTypeError(
                f"FlightRecorderHook: isolated must be True or False, got {isolated!r}"
            )
        self._isolated = isolated
        self._recorder = _Recorder(max_entries) if isolated else global_recorder()
        if isolated:  # as the reference does: operation ids start from 0 again
            reset_op_ids()
        self._tracks: list[_Track] = []
        self._registered = False

    @property
    def isolated(self) -> bool:
        """Whether this hook has a private recorder (else it shares the process-wide one)."""
        return self._isolated

    @property
    def max_entries(self) -> int:
        """Capacity of the recorder this hook records into."""
        return self._recorder.max_entries

    @property
    def enabled(self) -> bool:
        """The property spelling of :meth:`is_enabled`."""
        return self.is_enabled()

    def is_enabled(self) -> bool:
        """Whether this hook records: it was registered with a communicator (as in the
        reference, it stays enabled once registered) and its recorder keeps entries
        (its size is above 0). ``False`` before the first :meth:`register_with_comm`."""
        return self._registered and self._recorder.enabled

    def size(self) -> int:
        """Entries held now (at most the recorder's size)."""
        return self._recorder.size()

    def __len__(self) -> int:
        return self.size()

    def reset(self) -> None:
        """Drop every entry held (of the process-wide recorder too, when not isolated)."""
        self._recorder.reset()

    @staticmethod
    def attached_to(comm: TorchComm) -> list[FlightRecorderHook]:
        """The recorders recording ``comm`` (e.g. the one PyTorch attached for you)."""
        return list(_attached.get(comm, ()))

    def register_with_comm(self, comm: TorchComm) -> FlightRecorderHook:
        """Record ``comm``'s operations from now on (a no-op when the recorder is disabled).

        Returns the hook itself, so ``FlightRecorderHook().register_with_comm(c)`` works.
        """
        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"register_with_comm: expected a TorchComm, got {type(comm).__name__}"
            )
        if not self._recorder.enabled:
            return self
        self._registered = True
        _follow_splits()
        attached = _attached.setdefault(comm, [])
        if self not in attached:
            attached.append(self)
        if self._recorder.find(comm) is not None:
            return self
        track = self._recorder.add(comm)
        track.handles.append(comm.register_abort_hook(lambda: self._on_abort(track)))
        self._tracks.append(track)
        return self

    def unregister(self) -> None:
        """Stop recording the communicators this hook registered (entries are kept)."""
        for track in self._tracks:
            self._recorder.drop(track)
            comm = track.comm()
            if comm is not None and self in _attached.get(comm, ()):
                _attached[comm].remove(self)
        self._tracks = []

    def _on_abort(self, track: _Track) -> None:
        comm = track.comm()
        failed = comm is not None and not comm.is_aborted()  # abort() is deliberate
        try:
            self.dump()
        except OSError as exc:  # a failed dump must not hide the failure being reported
            sys.stderr.write(f"torchcomms: flight recorder dump failed: {exc}\n")
        if not failed:
            return
        _set_healthy(False)
        options = comm.get_options() if comm is not None else None
        if getattr(options, "abort_process_on_timeout_or_error", False):
            # The process aborts next: give a debug server time to see it is unhealthy
            # and fetch the dumps.
            time.sleep(_env.health_check_wait_ms() / 1000)

    # -- dumping ---------------------------------------------------------------------

    def dump_dict(self, include_completed: bool = True) -> dict[str, Any]:
        """The recorder's content in c10d's dump layout (entries oldest first)."""
        return self._recorder.dump_dict(include_completed)

    def dump_json(self, include_completed: bool = True) -> str:
        """The recorder's content as c10d's JSON trace (``include_completed=False``: only
        operations not yet completed)."""
        return json.dumps(self.dump_dict(include_completed))

    def dump_file(self, rank: int, include_completed: bool = True) -> str:
        """Write the trace as c10d does (pickle) for ``rank``; returns the file written.

        The file is ``$TORCHCOMM_FR_DUMP_TEMP_FILE<rank>``, or, with
        ``TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME=1``, ``$TORCHCOMM_FR_DUMP_TEMP_FILE`` itself.
        """
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise CommTypeError(f"dump_file: rank must be a non-negative int, got {rank!r}")
        return self.dump(dump_path(rank), format="pickle", include_completed=include_completed)

    def dump(
        self, path: str | None = None, *, format: str = "json", include_completed: bool = True
    ) -> str:
        """Write the dump to ``path`` (default ``<TORCHCOMM_FR_DUMP_TEMP_FILE><rank>``).

        ``format="pickle"`` writes what c10d's own recorder writes, for tools that read
        pickled dumps (``python -m torch.distributed.flight_recorder.fr_trace``).
        """
        if format not in ("json", "pickle"):
            raise CommInputError(f"dump: format must be 'json' or 'pickle', got {format!r}")
        if path is None:
            path = dump_path(self._global_rank())
        data = self.dump_dict(include_completed)
        if format == "json":
            payload = json.dumps(data).encode()
        else:
            for entry in data["entries"]:
                entry["process_group"] = tuple(entry["process_group"])
            payload = pickle.dumps(data)
        _write_private(path, payload)
        return path

    def _global_rank(self) -> int:
        return global_rank([t.comm() for t in self._tracks])

    def __repr__(self) -> str:
        return (
            f"<FlightRecorderHook max_entries={self.max_entries} isolated={self.isolated} "
            f"entries={self.size()} comms={len(self._tracks)}>"
        )


def dump_path(rank: int) -> str:
    """Where the dump of ``rank`` goes (``TORCHCOMM_FR_DUMP_DYNAMIC_FILE_NAME`` decides)."""
    try:
        dynamic = _env.fr_dump_dynamic_file_name()
    except ValueError as exc:
        raise CommInputError(str(exc)) from None
    raw = os.environ.get(_env.FR_DUMP_TEMP_FILE, "")
    if dynamic and raw:
        return raw
    return f"{_env.fr_dump_prefix()}{rank}"


def global_rank(comms: list[TorchComm | None] = ()) -> int:  # type: ignore[assignment]
    """This process's global rank: torch.distributed's, the launcher's, else a comm's."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except RuntimeError:
        pass
    found = _env.rank_and_size()
    if found is not None:
        return found[0]
    for comm in comms:
        if comm is not None:
            return comm.get_rank()
    return 0


def _write_private(path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` readable by this user only, never through a symlink.

    The bytes go to a fresh ``mkstemp`` file (``O_EXCL``, mode 0600, unpredictable name) in
    the target folder, which is then renamed over ``path``: a rename replaces a symlink
    planted at ``path`` instead of writing where it points. A missing folder is created
    private (0700).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def ranks_str(ranks: Any) -> str:
    """A group's ranks as the reference's recorder writes them in ``pg_config``:
    ``"[0,1,2]"`` (torch 2.13's c10d recorder puts a space after each comma; readers such
    as ``fr_trace`` parse either)."""
    return "[" + ",".join(str(int(r)) for r in ranks) + "]"


def _fallback_ranks(comm: TorchComm) -> list[int]:
    # An unregistered communicator as large as the job uses the job's ranks; others
    # can only be described by their own ranks.
    return list(range(comm.get_size()))
