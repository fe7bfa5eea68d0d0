"""``FlightRecorderHook``: the hook users register on communicators, and the process-wide
recorder it shares.

Owns the hook (registration on communicators and on the communicators split from them,
the dump calls, the dump on abort), the process-wide recorder non-isolated hooks share,
and the process's health as the debug handlers report it.

May import :mod:`.ring`, :mod:`.dump`, ``comm``, ``foundation``, ``operations`` and
``plugin_host``; never the c10d bridge, which is above it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from typing import Any

from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommTypeError
from torchcomms_core.hooks.flight_recorder.dump import dump_path, global_rank, write
from torchcomms_core.hooks.flight_recorder.ring import Track, _Recorder
from torchcomms_core.operations.args import reset_op_ids
from torchcomms_core.plugin_host.hookspecs import hookimpl
from torchcomms_core.plugin_host.manager import get_plugin_manager

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
    ``max_entries=0`` records nothing either way (it registers no hook, so calls keep the
    communicator's lean lane): PyTorch's ``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` switch
    passes ``TORCH_FR_BUFFER_SIZE`` here, 0 unless set.
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
        # A hook asked for no entries records nothing, shared or not: PyTorch's switch
        # passes its own buffer size (TORCH_FR_BUFFER_SIZE, 0 unless set) here, and a hook
        # that records nothing must not take the communicator off its lean lane.
        self._recorder = (
            _Recorder(max_entries) if isolated or max_entries == 0 else global_recorder()
        )
        if isolated:  # as the reference does: operation ids start from 0 again
            reset_op_ids()
        self._tracks: list[Track] = []
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

    def _on_abort(self, track: Track) -> None:
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
        write(path, self.dump_dict(include_completed), format)
        return path

    def _global_rank(self) -> int:
        return global_rank([t.comm() for t in self._tracks])

    def __repr__(self) -> str:
        return (
            f"<FlightRecorderHook max_entries={self.max_entries} isolated={self.isolated} "
            f"entries={self.size()} comms={len(self._tracks)}>"
        )
