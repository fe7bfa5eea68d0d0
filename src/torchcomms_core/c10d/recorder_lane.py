"""The c10d bridge's engine lane, as the flight recorder sees it.

A c10d engine (``ProcessGroupGloo``) records each operation it is given into c10d's
own flight recorder: shapes, dtypes, the caller's Python stack, the creation time, and
``retired`` once the operation finished. When the c10d bridge hands a call to such an
engine directly (its engine lane), recording it again in torchcomms' flight recorder would
be the whole cost of recording. The lane then logs, per call, only its index, the
operation's name and the engine's operation id (a ``_Lane``); a dump joins that log with
c10d's records of the engine, which the bridge names after the group (``lane_tags``), and
numbers the calls among the entries recorded by the hooks (see ``_Lane.numbers``).

The flight recorder (``torchcomms_core.hooks.flight_recorder``), below the bridge, knows
nothing of c10d: this module gives it the reader of the lanes' entries
(``set_lane_reader``) when it loads, as ``world.describe`` names the dumped groups.

May import ``torchcomms_core.hooks.flight_recorder`` and torch; not the rest of the bridge.
"""

from __future__ import annotations

import bisect
import collections
import datetime
import itertools
import os
import pickle
import threading
import time
import weakref
from typing import Any

from torchcomms_core.hooks.flight_recorder.entry import RENDERED
from torchcomms_core.hooks.flight_recorder.ring import Track, set_lane_reader


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
    the lane's calls from 1). ``marks`` holds, before each entry the hooks record on the same
    track, ``(lane calls so far, collective, p2p and op counters)``: the lane's calls and
    those entries share one numbering, as if the hooks had recorded every call.
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

    def logged(self) -> bool:
        """Whether the lane holds calls to dump."""
        return bool(self.log)

    def mark(self, track: Track) -> int:
        """Before the hooks record an entry on ``track`` (the lock is held): note where
        it falls among the lane's calls, which it returns."""
        before = self.calls()
        marks = self.marks
        if len(marks) == marks.maxlen:
            self.first = max(self.first, marks[0][0])
        marks.append((before, track.collective_seq, track.p2p_seq, track.recorder.op_seq))
        return before

    def numbers(self, index: int, track: Track) -> tuple[int, int, int] | None:
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
    inp = (RENDERED, c10d.get("input_sizes") or [], c10d.get("input_dtypes") or [])
    out_sizes = c10d.get("output_sizes") or []
    out_types = c10d.get("output_dtypes") or []
    if kind == "all_gather_single" and len(out_sizes) == 1 and len(out_sizes[0]) >= 2:
        n, first, *rest = out_sizes[0]
        out_sizes = [[n * first, *rest]]
    elif kind == "reduce_scatter_single" and len(inp[1]) == 1 and inp[1][0] and size > 0:
        first, *rest = inp[1][0]
        out_sizes, out_types = [[first // size, *rest]], list(inp[2])
    return inp, (RENDERED, out_sizes, out_types)


def _lane_entries(tracks: list[Track], stacks: bool) -> list[list[Any]]:
    """The engine lanes' calls of ``tracks`` as entries, from c10d's records of them."""
    lanes = [(t, lane) for t in tracks if isinstance(lane := t.lane, _Lane) and lane.log]
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
                    (RENDERED, record.get("frames") or []),
                    None,
                    None,  # no algorithm: c10d's engine chose how to run it (#45)
                ]
            )
    return out


def engine_lane(track: Track, engine: Any, tags: set[str]) -> _Lane:
    """``track``'s engine lane for ``engine``, whose records in c10d's recorder carry one
    of ``tags`` (the set is shared: names added later count)."""
    lane = track.lane
    if not isinstance(lane, _Lane) or lane.engine() is not engine:
        lane = _Lane(engine, max(c10d_recorder_size(), 1))
        track.lane = lane
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


# Dumps of the flight recorder read the lanes' calls from c10d's records.
set_lane_reader(_lane_entries)
