"""``FlightRecorderHook``: a ring buffer of a communicator's last operations, dumped as c10d does.

Dumps use the fields of c10d's own flight recorder, so PyTorch's analyzer
(``torch.distributed.flight_recorder``) can match operations across ranks.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import pickle
import sys
import tempfile
import threading
import time
import weakref
from typing import Any

import torch

from .. import _env
from ..comm import RemovableHandle, TorchComm
from ..errors import CommInputError, CommTypeError
from ..work import WorkStatus

#: The c10d flight-recorder format version our dumps follow.
VERSION = "2.10"

# Analyzer operation names for ours where they differ.
_PROFILING_NAMES = {"gather_single": "gather"}
_SCALAR_NAMES = {
    torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
    torch.bfloat16: "BFloat16", torch.int8: "Char", torch.uint8: "Byte",
    torch.int16: "Short", torch.int32: "Int", torch.int64: "Long", torch.bool: "Bool",
    torch.complex64: "ComplexFloat", torch.complex128: "ComplexDouble",
}
_MAX_FRAMES = 32
_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Recorders attached to each communicator, so process groups split from it through
# ``torch.distributed`` are recorded too (weak: a dead comm needs no recording).
_attached: weakref.WeakKeyDictionary[TorchComm, list[FlightRecorderHook]] = (
    weakref.WeakKeyDictionary())


def inherit_recorders(parent: TorchComm, child: TorchComm) -> None:
    """Register ``child`` with every recorder that records ``parent``."""
    for recorder in list(_attached.get(parent, ())):
        recorder.register_with_comm(child)


def _scalar_name(dtype: torch.dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype).replace("torch.", ""))


def _stacked(tensors: Any) -> tuple[list[list[int]], list[str]]:
    """Sizes of a per-rank tensor list as c10d reports them: one stacked shape when uniform."""
    items = [t for t in tensors if isinstance(t, torch.Tensor)]
    if not items:
        return [], []
    shapes = {tuple(t.shape) for t in items}
    if len(shapes) == 1:
        return [[len(items), *items[0].shape]], [_scalar_name(items[0].dtype)]
    return [list(t.shape) for t in items], [_scalar_name(t.dtype) for t in items]


def _sizes(*tensors: Any) -> tuple[list[list[int]], list[str]]:
    items = [t for t in tensors if isinstance(t, torch.Tensor)]
    return [list(t.shape) for t in items], [_scalar_name(t.dtype) for t in items]


def _io(op: str, fields: dict[str, Any]) -> tuple[Any, Any]:
    """``((input_sizes, input_dtypes), (output_sizes, output_dtypes))`` of one operation."""
    f = fields.get
    if op in ("all_reduce", "broadcast", "reduce", "send", "recv"):
        s = _sizes(f("tensor"))
        return s, s
    if op in ("all_gather", "all_gather_v"):
        return _sizes(f("tensor")), _stacked(f("tensor_list") or [])
    if op in ("reduce_scatter", "reduce_scatter_v"):
        return _stacked(f("input_list") or []), _sizes(f("output"))
    if op == "all_to_all":
        return (_sizes(*(f("input_tensor_list") or [])),
                _sizes(*(f("output_tensor_list") or [])))
    if op == "scatter":
        return _stacked(f("input_tensor_list") or []), _sizes(f("output_tensor"))
    if op == "gather":
        return _sizes(f("input_tensor")), _stacked(f("output_tensor_list") or [])
    if "input" in fields or "output" in fields:
        return _sizes(f("input")), _sizes(f("output"))
    tensors = [v for v in fields.values() if isinstance(v, torch.Tensor)]
    return _sizes(*tensors), _sizes(*tensors)


def _frames() -> list[dict[str, Any]]:
    """The caller's Python stack, innermost first, without torchcomms' own frames."""
    out: list[dict[str, Any]] = []
    frame = sys._getframe(1)
    while frame is not None and len(out) < _MAX_FRAMES:
        code = frame.f_code
        if not code.co_filename.startswith(_HERE):
            out.append({"name": code.co_name, "filename": code.co_filename,
                        "line": frame.f_lineno})
        frame = frame.f_back
    return out


class _Track:
    """What the recorder knows of one communicator: its id, counters and open entries."""

    __slots__ = ("pg_id", "comm", "collective_seq", "p2p_seq", "op_seq", "open", "handles")

    def __init__(self, pg_id: int, comm: TorchComm) -> None:
        self.pg_id = pg_id
        self.comm = weakref.ref(comm)
        self.collective_seq = 0
        self.p2p_seq = 0
        self.op_seq = 0
        self.open: dict[int, list[dict[str, Any]]] = {}
        self.handles: list[RemovableHandle] = []


class FlightRecorderHook:
    """Keep the last ``max_entries`` operations of the communicators it is registered with.

    ``max_entries=0`` records nothing (PyTorch passes 0 unless ``TORCH_FR_BUFFER_SIZE``
    is set). ``dump()`` writes JSON to ``$TORCHCOMM_FR_DUMP_TEMP_FILE<global rank>`` (by
    default ``~/.cache/torch/comm_lib_trace_rank_<rank>``, mode 0600); a
    failed, timed-out or aborted operation dumps automatically.
    """

    def __init__(self, max_entries: int = 2000) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int):
            raise CommTypeError(f"FlightRecorderHook: max_entries must be an int, got "
                                f"{max_entries!r}")
        if max_entries < 0:
            raise CommInputError(f"FlightRecorderHook: max_entries must be >= 0, got "
                                 f"{max_entries}")
        self.max_entries = max_entries
        self._entries: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=max_entries or None)
        self._tracks: list[_Track] = []
        self._record_ids = 0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    @staticmethod
    def attached_to(comm: TorchComm) -> list[FlightRecorderHook]:
        """The recorders recording ``comm`` (e.g. the one PyTorch attached for you)."""
        return list(_attached.get(comm, ()))

    def register_with_comm(self, comm: TorchComm) -> FlightRecorderHook:
        """Record ``comm``'s operations from now on (a no-op when ``max_entries`` is 0)."""
        if not isinstance(comm, TorchComm):
            raise CommTypeError(f"register_with_comm: expected a TorchComm, got "
                                f"{type(comm).__name__}")
        if not self.enabled or any(t.comm() is comm for t in self._tracks):
            return self
        track = _Track(len(self._tracks), comm)
        track.handles = [
            comm.register_pre_hook(lambda name, op_id, args: self._pre(track, name, op_id, args)),
            comm.register_post_hook(lambda op_id, args: self._post(track, op_id, args)),
            comm.register_abort_hook(self._on_failure),
        ]
        self._tracks.append(track)
        _attached.setdefault(comm, []).append(self)
        return self

    def unregister(self) -> None:
        """Stop recording every communicator (the entries so far are kept)."""
        for track in self._tracks:
            for handle in track.handles:
                handle.remove()
            comm = track.comm()
            if comm is not None and self in _attached.get(comm, ()):
                _attached[comm].remove(self)
        self._tracks = []

    # -- recording -------------------------------------------------------------------

    def _pre(self, track: _Track, name: Any, op_id: int, args: Any) -> None:
        op = str(name)
        now = time.time_ns()
        frames = _frames()
        timeout = args.timeout
        comm = track.comm()
        if timeout is None and comm is not None:
            timeout = comm.get_timeout()
        timeout_ms = int(timeout.total_seconds() * 1000) if timeout is not None else 0
        if op == "batch_op_issue":
            items = [(kind, {"tensor": t}, peer) for kind, t, peer in args.ops]
        else:
            peer = args.as_dict().get("dst", args.as_dict().get("src"))
            items = [(op, args.as_dict(), peer)]
        me = comm.get_rank() if comm is not None else -1
        backend = comm.get_backend() if comm is not None else "gloo"
        entries = []
        with self._lock:
            # The sends and receives of one batch share a sequence id, as c10d's
            # coalesced point-to-point groups do.
            if op == "batch_op_issue":
                track.p2p_seq += 1
            for kind, fields, peer in items:
                (in_sizes, in_types), (out_sizes, out_types) = _io(kind, fields)
                p2p = kind in ("send", "recv")
                track.op_seq += 1
                if p2p:
                    if op != "batch_op_issue":
                        track.p2p_seq += 1
                    label = f"send {me}->{peer}" if kind == "send" else f"recv {me}<-{peer}"
                else:
                    track.collective_seq += 1
                    label = _PROFILING_NAMES.get(kind, kind)
                entry = {
                    "record_id": self._record_ids,
                    "pg_id": track.pg_id,
                    "collective_seq_id": track.collective_seq,
                    "p2p_seq_id": track.p2p_seq,
                    "op_id": track.op_seq,
                    "profiling_name": f"{backend}:{label}",
                    "time_created_ns": now,
                    "input_sizes": in_sizes,
                    "input_dtypes": in_types,
                    "output_sizes": out_sizes,
                    "output_dtypes": out_types,
                    "state": "scheduled",
                    "time_discovered_started_ns": 0,
                    "time_discovered_completed_ns": 0,
                    "retired": False,
                    "timeout_ms": timeout_ms,
                    "is_p2p": p2p,
                    "thread_id": str(threading.get_ident()),
                    "thread_name": threading.current_thread().name,
                    "frames": frames,
                    "_work": None,
                }
                self._record_ids += 1
                self._entries.append(entry)
                entries.append(entry)
            track.open[op_id] = entries

    def _post(self, track: _Track, op_id: int, args: Any) -> None:
        entries = track.open.pop(op_id, None)
        if not entries:
            return
        now = time.time_ns()
        work = args.work
        for entry in entries:
            entry["state"] = "started"
            entry["time_discovered_started_ns"] = now
            entry["_work"] = work
            self._settle(entry, now)

    @staticmethod
    def _settle(entry: dict[str, Any], now: int) -> None:
        work = entry["_work"]
        if work is None:
            return
        status = work.status
        if status is WorkStatus.COMPLETED:
            entry["state"] = "completed"
            entry["retired"] = True
            entry["time_discovered_completed_ns"] = now
            entry["_work"] = None
        elif status is not WorkStatus.INPROGRESS:
            entry["retired"] = True
            entry["_work"] = None

    def _on_failure(self) -> None:
        try:
            self.dump()
        except OSError as exc:  # a failed dump must not hide the failure being reported
            sys.stderr.write(f"torchcomms: flight recorder dump failed: {exc}\n")

    # -- dumping ---------------------------------------------------------------------

    def dump_dict(self) -> dict[str, Any]:
        """The recorder's content in c10d's dump layout (entries oldest first)."""
        from .groups import describe

        now = time.time_ns()
        with self._lock:
            entries = list(self._entries)
        groups: dict[int, tuple[str, str, Any]] = {}
        pg_config: dict[str, dict[str, str]] = {}
        pg_status: dict[str, dict[str, int]] = {}
        for track in self._tracks:
            comm = track.comm()
            if comm is None:
                continue
            name, desc, ranks = describe(comm)
            if ranks is None:
                ranks = _fallback_ranks(comm)
            groups[track.pg_id] = (name, desc, ranks)
            pg_config[name] = {"name": name, "desc": desc, "ranks": str(list(ranks))}
        out = []
        for entry in entries:
            self._settle(entry, now)
            item = {k: v for k, v in entry.items() if k != "_work"}
            name, desc, _ = groups.get(entry["pg_id"], (str(entry["pg_id"]), "undefined", []))
            item["process_group"] = [name, desc]
            out.append(item)
            if not entry["is_p2p"]:
                status = pg_status.setdefault(str(entry["pg_id"]), {
                    "last_enqueued_collective": -1, "last_started_collective": -1,
                    "last_completed_collective": -1})
                seq = entry["collective_seq_id"]
                status["last_enqueued_collective"] = seq
                if entry["state"] in ("started", "completed"):
                    status["last_started_collective"] = seq
                if entry["state"] == "completed":
                    status["last_completed_collective"] = seq
        return {"version": VERSION, "comm_lib_version": "", "pg_config": pg_config,
                "pg_status": pg_status, "nccl_comm_state": {}, "entries": out}

    def dump_json(self) -> str:
        return json.dumps(self.dump_dict())

    def dump(self, path: str | None = None, *, format: str = "json") -> str:
        """Write the dump to ``path`` (default ``<TORCHCOMM_FR_DUMP_TEMP_FILE><rank>``).

        ``format="pickle"`` writes what c10d's own recorder writes, for tools that read
        pickled dumps (``python -m torch.distributed.flight_recorder.fr_trace``).
        """
        if format not in ("json", "pickle"):
            raise CommInputError(f"dump: format must be 'json' or 'pickle', got {format!r}")
        if path is None:
            path = f"{_env.fr_dump_prefix()}{self._global_rank()}"
        data = self.dump_dict()
        if format == "json":
            payload = json.dumps(data).encode()
        else:
            for entry in data["entries"]:
                entry["process_group"] = tuple(entry["process_group"])
            payload = pickle.dumps(data)
        _write_private(path, payload)
        return path

    def _global_rank(self) -> int:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.get_rank()
        except RuntimeError:
            pass
        found = _env.rank_and_size()
        if found is not None:
            return found[0]
        for track in self._tracks:
            comm = track.comm()
            if comm is not None:
                return comm.get_rank()
        return 0

    def __repr__(self) -> str:
        return (f"<FlightRecorderHook max_entries={self.max_entries} entries="
                f"{len(self._entries)} comms={len(self._tracks)}>")


def _write_private(path: str, payload: bytes) -> None:
    """Write ``payload`` to ``path`` readable by this user only, never through a symlink.

    The bytes go to a fresh ``mkstemp`` file (``O_EXCL``, mode 0600, unpredictable name) in
    the target folder, which is then renamed over ``path``: a rename replaces a symlink
    planted at ``path`` instead of writing where it points. A missing folder is created
    private (0700).
    """
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fallback_ranks(comm: TorchComm) -> list[int]:
    # An unregistered communicator as large as the job uses the job's ranks; others
    # can only be described by their own ranks.
    return list(range(comm.get_size()))
