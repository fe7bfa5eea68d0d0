"""The flight recorder's ring: the bounded store of recorded operations.

Owns ``_Recorder`` (a ring of entries of the layout :mod:`.entry` defines, and the
communicators that feed it through their pre- and post-hooks) and ``Track`` (what a
recorder knows of one communicator). Calls that the c10d bridge gives its engine
directly are recorded with :meth:`_Recorder.record_lane`; calls that c10d's own recorder
records for the bridge come in through the reader the bridge installs
(:func:`set_lane_reader`), and are numbered among the others through the track's
``lane`` (an :class:`EngineLane`).

May import :mod:`.entry`, :mod:`.dump`, ``comm``, ``foundation``, ``operations`` and
``hooks._args``; never the c10d bridge, which is above it.
"""

from __future__ import annotations

import collections
import functools
import heapq
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import torch

from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation.work import TorchWork, WorkStatus
from torchcomms_core.hooks import _args
from torchcomms_core.hooks.flight_recorder.dump import render
from torchcomms_core.hooks.flight_recorder.entry import (
    _ALGORITHM,
    _COMPLETED,
    _KIND,
    _ONE,
    _OP_NAMES,
    _RECORD_ID,
    _RETIRED,
    _STARTED,
    _STATE,
    _WORK,
    _created,
    _frames,
    _io,
    _op_str,
)


class EngineLane(Protocol):
    """The numbering of the calls c10d's recorder records for a track (the c10d bridge's
    ``_Lane``): they share one numbering with the entries recorded here."""

    #: Calls up to this one were dropped by a reset.
    floor: int

    def calls(self) -> int:
        """How many calls took the lane so far."""
        ...

    def logged(self) -> bool:
        """Whether the lane holds calls to dump."""
        ...

    def mark(self, track: Track) -> int:
        """Before an entry is recorded on ``track`` (the lock is held): note where it
        falls among the lane's calls, which it returns."""
        ...


def _no_lanes(tracks: list[Track], stacks: bool) -> list[list[Any]]:
    return []


# The entries of the engine lanes of some tracks (with stacks or not), from c10d's
# records of them. The c10d bridge, the only one to give a track a lane, installs its
# reader when it loads (``set_lane_reader``).
_read_lanes: Callable[[list[Track], bool], list[list[Any]]] = _no_lanes


def set_lane_reader(read: Callable[[list[Track], bool], list[list[Any]]]) -> None:
    """Read the engine lanes' entries with ``read(tracks, stacks)`` (the c10d bridge
    installs its reader of c10d's records)."""
    global _read_lanes
    _read_lanes = read


class Track:
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
        self.lane: EngineLane | None = None
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

# Asynchronous engine-lane entries whose work is kept to settle them, per communicator.
_LANE_OPEN = 64
# Unregistered communicators whose engine-lane calls a recorder still dumps.
_DROPPED_LANES = 64

# The track of each communicator that one recorder records (by ``id``; the track's weak
# reference tells a reused id apart), for the c10d bridge's engine lane: see lane_track.
_lane_tracks: dict[int, Track] = {}


def lane_track(comm: TorchComm) -> Track | None:
    """The track recording ``comm``, when a flight recorder's hooks are its only hooks'
    reason to exist (the caller still checks that no other hooks are registered)."""
    track = _lane_tracks.get(id(comm))
    if track is not None and track.comm() is comm:
        return track
    return None


def _chosen(comm: TorchComm | None, op: str) -> str | None:
    """The algorithm ``comm``'s backend last chose for ``op`` (``None``: it chose none)."""
    if comm is None:
        return None
    try:
        choice = comm.get_backend_impl().tuning.last.get(op)
    except Exception:  # a duck-typed backend without tuning
        return None
    return None if choice is None else str(choice)


class _Recorder:
    """A ring buffer of operations and the communicators that feed it."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.entries: collections.deque[list[Any]] = collections.deque(maxlen=max_entries or None)
        self.tracks: list[Track] = []
        # Tracks no longer recording whose engine lane still has calls to dump (their
        # other entries stay in ``entries``, as every track's do).
        self.dropped: collections.deque[Track] = collections.deque(maxlen=_DROPPED_LANES)
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

    def find(self, comm: TorchComm) -> Track | None:
        return next((t for t in self.tracks if t.comm() is comm), None)

    def add(self, comm: TorchComm) -> Track:
        track = Track(self, self.next_pg_id, comm)
        self.next_pg_id += 1
        _lane_tracks[id(comm)] = track
        track.handles = [
            comm.register_pre_hook(functools.partial(self.pre, track)),
            comm.register_post_hook(functools.partial(self.post, track)),
        ]
        self.tracks.append(track)
        return track

    def drop(self, track: Track) -> None:
        track.remove()
        if track in self.tracks:
            self.tracks.remove(track)
            if track.lane is not None and track.lane.logged():
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

    def pre(self, track: Track, name: Any, op_id: int, args: Any) -> None:
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
        # What every entry of this call shares: when, its timeout, its thread and stack.
        call = (now, timeout, threading.get_ident(), threading.current_thread().name, frames)
        fields = _args.fields(args)
        if op == "batch_op_issue":
            batch = _args.batch_ops(args)
            if batch is not None:
                self._record_batch(track, op_id, batch, comm, call)
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
            entry = self._append(track, op, me, peer, inp, out, p2p, call, lane)
            track.open[op_id] = [entry]

    def _append(
        self,
        track: Track,
        op: str,
        me: int | None,
        peer: int | None,
        inp: Any,
        out: Any,
        p2p: bool,
        call: tuple[int, Any, int, Any, Any],
        lane: int,
    ) -> list[Any]:
        """A new scheduled entry (fields in the order of ``_RECORD_ID`` ... ``_WORK``), kept;
        the caller holds the lock and has advanced the track's sequence ids. ``call``:
        ``(created, timeout, thread id, thread or its name, frames)``; ``lane``: the
        engine lane's calls before it (see ``EngineLane``), which its collective and
        operation numbers count too."""
        created, timeout, thread_id, thread_name, frames = call
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
            created,
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
            None,
        ]
        self.record_ids += 1
        self.entries.append(entry)
        return entry

    def _record_batch(
        self,
        track: Track,
        op_id: int,
        batch: list[tuple[str, Any, Any]],
        comm: TorchComm | None,
        call: tuple[int, Any, int, Any, Any],
    ) -> None:
        """One entry per send/recv of a batch, sharing one point-to-point sequence id as
        c10d's coalesced groups do."""
        me = comm.get_rank() if comm is not None else -1
        ios = [_io(kind, {"tensor": t}) for kind, t, _ in batch]
        with self.lock:
            lane = track.lane.mark(track) if track.lane is not None else 0
            track.p2p_seq += 1
            track.open[op_id] = [
                self._append(track, kind, me, peer, inp, out, True, call, lane)
                for (kind, _, peer), (inp, out) in zip(batch, ios, strict=True)
            ]

    def post(self, track: Track, op_id: int, args: Any) -> None:
        entries = track.open.pop(op_id, None)
        if not entries:
            return
        now = time.time_ns()
        work = getattr(args, "work", None)
        # A synchronous operation has completed by now: its work is not kept.
        done = work is not None and work.status is WorkStatus.COMPLETED
        # The algorithm the backend chose for it, when it declares algorithms (#45).
        chosen = _chosen(track.comm(), entries[0][_KIND])
        for entry in entries:
            entry[_ALGORITHM] = chosen
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
        track: Track,
        op: str,
        inp: torch.Tensor | None,
        out: torch.Tensor | None,
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
        call for it (see ``EngineLane``)."""
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
        # Its thread's name is read when dumping.
        call = (created, timeout, threading.get_ident(), thread, frames)
        # This runs on every call the bridge records: the lock is taken without a with
        # block (a third of the cost, here).
        lock = self.lock
        lock.acquire()
        try:
            lane = track.lane.mark(track) if track.lane is not None else 0
            track.collective_seq += 1
            entry = self._append(track, op, None, None, one_in, one_out, False, call, lane)
            entry[_STARTED] = created
            if done:
                entry[_STATE] = "completed"
                entry[_COMPLETED] = now
                entry[_RETIRED] = True
                return
            entry[_STATE] = "started"
            self._open_lane(track, entry, work, now)
        finally:
            lock.release()

    def _open_lane(self, track: Track, entry: list[Any], work: Any, now: int) -> None:
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

    # -- reading ---------------------------------------------------------------------

    def held(self, stacks: bool = False) -> tuple[list[list[Any]], list[Track]]:
        """The entries held now, oldest first, the engine lanes' among them (see
        ``EngineLane``), at most ``max_entries``; and the tracks."""
        with self.lock:
            entries = list(self.entries)
            tracks = list(self.tracks)
            dropped = list(self.dropped)
            total = self.record_ids
        lane = _read_lanes(tracks + dropped, stacks)
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
        """The content in c10d's dump layout (see ``dump.render``)."""
        now = time.time_ns()
        entries, tracks = self.held(stacks=True)
        for entry in entries:
            self.settle(entry, now)
        return render(entries, tracks, include_completed)
