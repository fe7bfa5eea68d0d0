"""``_BackendWrapper``: a ``torch.distributed.ProcessGroup`` that runs on a ``TorchComm``.

This module is the c10d ``Backend`` face: identity, options, lifecycle, splits and the
coalescing block. The operations come from one table (``bridge_ops.OPS``): each becomes a
method here that takes the engine lane or the general path (see ``bridge_ops``); c10d's
arguments are converted in ``c10d_args``, point-to-point batches live in ``p2p_batch`` and
profiler records in ``profiling``.

PyTorch imports this module while ``torch.distributed`` is half-initialised, so nothing
here touches ``torch.distributed`` at import time (only ``torch._C._distributed_c10d``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import torch
from torch._C._distributed_c10d import ProcessGroup, Store

from torchcomms_core.c10d import backend_adapter, comm_lane, profiling
from torchcomms_core.c10d.args import engine_label
from torchcomms_core.c10d.comm_lane import follow_lane_changes
from torchcomms_core.c10d.engine_access import (
    _NOT_DELEGATED,
    _backend_type,
    _c10d_engine,
    _c10d_group_engine,
    _c10d_registered,
    _guard_register_backend,
    _name_group_engine,
    _records_into_c10d,
    c10d_identity,
)
from torchcomms_core.c10d.monitored_barrier import (
    engine_monitored_barrier,
    profiled_monitored_barrier,
)
from torchcomms_core.c10d.ops import OPS, BridgeOp, barrier_tensor
from torchcomms_core.c10d.p2p_batch import P2PBatch
from torchcomms_core.c10d.recorder_lane import _Lane, c10d_recorder_size, engine_lane, lane_tags
from torchcomms_core.c10d.work import CommWork
from torchcomms_core.c10d.world import describe
from torchcomms_core.comm.base import is_bound_and_usable
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.creation.group_record import group_being_created
from torchcomms_core.creation.pg_options import hints_from_pg_options
from torchcomms_core.foundation import torch_compat
from torchcomms_core.foundation.errors import CommStateError, CommTypeError
from torchcomms_core.hooks.flight_recorder import lane_track, set_group_describer

if TYPE_CHECKING:
    from torch.distributed.distributed_c10d import GroupName


_time_ns = time.time_ns
# _BackendWrapper._lane's answer for a call nothing observes.
_UNRECORDED = object()


def _profiler_enabled() -> bool:
    """Whether a profiler records; rebinds itself to torch's own check on first use (torch
    is half-initialised when this module is imported)."""
    global _profiler_enabled
    check: Callable[[], bool] = torch._C._autograd._profiler_enabled
    _profiler_enabled = check
    return check()


class _BackendWrapper(ProcessGroup):
    """A process group that forwards every c10d operation to a ``TorchComm``.

    ``torch.distributed`` builds one per communicator when
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``; ``torchcomms.device_mesh`` builds and
    registers them for meshes. Ranks are the communicator's ranks. It is its own backend
    (``_get_backend(device)`` returns it) and reports its engine's name (``"gloo"``),
    options and profiler records, as a group with that engine would.
    """

    # Backend-level capabilities c10d asks of ``_get_backend(device)``, which is us.
    supports_splitting = True
    supports_coalescing = True
    supports_time_estimate = False

    def __init__(self, comm: TorchComm) -> None:
        if not isinstance(comm, TorchComm):
            raise CommTypeError(
                f"_BackendWrapper needs a torchcomms TorchComm, got {type(comm).__name__}"
            )
        # A torch whose c10d internals the bridge does not know fails here, clearly.
        torch_compat.check_tested()
        # The (store, rank, size) constructor cannot build Python subclasses.
        # The stub lists only that one; c10d also binds (rank, size), which we use.
        super().__init__(comm.get_rank(), comm.get_size())  # type: ignore[call-arg]
        self._comm = comm
        self.comm = comm
        self._device = torch.device(comm.get_device().type)
        self._engine = _c10d_engine(comm)
        # An engine that is a whole c10d ProcessGroup (a Python backend registered with
        # c10d, such as PyTorch's ``threaded`` one): operations take the general path,
        # its own attributes are reachable (see __getattr__).
        self._group_engine = _c10d_group_engine(comm)
        # How many entries c10d's own flight recorder keeps of what the engine records,
        # stacks included (0: the engine records nothing there); see _update_lane.
        self._c10d_records = c10d_recorder_size() if _records_into_c10d(self._engine) else 0
        # The name c10d's own group would report: the engine's ("gloo"), else the backend's.
        if self._engine is not None:
            # A backend registered with c10d is of c10d's CUSTOM type, and a plain group
            # of it is named so ("custom"), whatever its engine calls itself.
            self._backend_name = "custom" if _c10d_registered(comm) else str(self._engine.name())
        elif self._group_engine is not None:
            self._backend_name = str(self._group_engine.getBackendName())
        else:
            self._backend_name = comm.get_backend()
        # What c10d reports for this group (pg.name(), _get_backend_name()): a backend c10d
        # builds in keeps its name, any other (shm, hier, ncclx, a vendor's) is one c10d
        # registered, which it calls "custom", with the switch on or off. Our own name is
        # the communicator's: group.get_comm().get_backend().
        # An engine that is c10d's own (or a Python group) already says what c10d says.
        if self._engine is None and self._group_engine is None:
            self._c10d_name = c10d_identity(self._backend_name)
        else:
            self._c10d_name = self._backend_name
        self._options: Any = None
        # c10d keeps a group's name in its backends, and we register none of our own.
        self._group_name = ""
        self._group_desc = "undefined"
        self._global_ranks: list[int] = []
        # Who speaks in c10d-style errors (ProcessGroupGloo when the engine is gloo's).
        self.label = engine_label(self._backend_name, self._engine is not None)
        # A point-to-point batch being collected, and the works of a coalescing block.
        self.pending: P2PBatch | None = None
        self.coalescing: list[CommWork] | None = None
        self._split_names: dict[str, int] = {}
        # The lane c10d's calls take while nothing is being batched (see _lane), and the
        # timeout recorded calls are recorded with: recomputed when the communicator says
        # they may have changed, rather than asked on every call.
        self._lane_now: Any = None
        self._comm_calls: dict[str, Any] | None = None
        self._lane_timeout = comm.get_timeout()
        # The names c10d's records of the engine carry (see _name_engine), and whether
        # the last one is this engine's alone.
        self._engine_tags: set[str] = set()
        self._engine_tagged = False
        # Why this group no longer describes its communicator (a reconfigure changed its
        # rank or size), or "" while it does; see _follow.
        self._stale = ""
        if self._engine is not None:
            # C++ callers (DDP's logger) look the engine up by the type the name says.
            self._register_backend(self._device, _backend_type(self._backend_name), self._engine)
            self._name_engine(comm.get_name())
        follow_lane_changes(self, comm, _BackendWrapper._update_lane)
        self._update_lane()
        # Built by c10d's helper (a group of torch 2.14's switch, or a registered backend's
        # creator): its members' global ranks, as c10d gives a backend's options.
        context = group_being_created()
        if context is not None and len(context.global_ranks) == comm.get_size():
            self._set_global_ranks(context.global_ranks)

    # -- identity --------------------------------------------------------------------

    def get_comm(self) -> TorchComm:
        """The communicator every operation of this group runs on."""
        return self._comm

    # The stub promises a Store; a communicator created without one has none to give.
    def get_group_store(self) -> Store | None:  # type: ignore[override]
        """The communicator's store (c10d builds further groups on a group's store)."""
        store = self._comm.get_options().store
        return store if isinstance(store, Store) else None

    def getBackendName(self) -> str:  # noqa: N802 - c10d's virtual method name
        return self._c10d_name

    def getGroupName(self) -> str:  # noqa: N802
        return self._group_name

    def setGroupName(self, name: str) -> None:  # noqa: N802
        self._set_group_name(name)

    def getGroupDesc(self) -> str:  # noqa: N802
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:  # noqa: N802
        self._set_group_desc(desc)

    def _set_group_name(self, name: str) -> None:
        self._group_name = str(name)
        opts = self.options
        if hasattr(opts, "group_name"):
            opts.group_name = self._group_name
        if self._engine is not None:
            self._name_engine(self._group_name)
            self._update_lane()
        if self._group_engine is not None:
            _name_group_engine(self._group_engine, self._group_name)

    def _set_group_desc(self, desc: str) -> None:
        self._group_desc = str(desc)
        if self._engine is not None:
            self._engine_names(desc=self._group_desc)

    def _engine_names(self, name: str = "", desc: str = "") -> None:
        """Set the engine's group name or description, as a c10d group does for its
        backends. Only a ``ProcessGroup`` passes them to a backend, and ours answers
        c10d's name calls in Python: a plain one, holding nothing else, does it."""
        holder = ProcessGroup(self.rank(), self.size())  # type: ignore[call-arg]
        holder._register_backend(self._device, _backend_type(self._backend_name), self._engine)
        if name:
            holder._set_group_name(name)  # type: ignore[arg-type]  # GroupName is a str
        if desc:
            holder._set_group_desc(desc)

    def _name_engine(self, name: str) -> None:
        """Give the engine the group's name, which c10d's recorder writes into the
        engine's records, so dumps, ours and c10d's, can tell this group's records from
        other groups'."""
        if not name:
            return
        self._engine_names(name=name)
        self._engine_tags.add(name)
        self._engine_tagged = lane_tags(self._engine, name)

    def _set_global_ranks(self, ranks: Sequence[int]) -> None:
        """The members' global ranks, as c10d records them in a gloo group's options."""
        self._global_ranks = [int(r) for r in ranks]
        opts = self.options
        if hasattr(opts, "global_ranks_in_group"):
            opts.global_ranks_in_group = list(self._global_ranks)

    @property
    def group_name(self) -> GroupName:
        # GroupName is c10d's NewType of str, so any name is one.
        return cast("GroupName", self._group_name)

    @property
    def group_desc(self) -> str:
        return self._group_desc

    @property
    def options(self) -> Any:
        """The backend options c10d's group would hold (the engine's own when it has one)."""
        if self._options is None:
            engine = self._engine
            if engine is not None and hasattr(engine, "options"):
                self._options = engine.options
            else:
                from torch._C._distributed_c10d import Backend

                self._options = Backend.Options(self._backend_name, self._comm.get_timeout())
        return self._options

    @property
    def _device_types(self) -> list[torch.device]:
        return [self._device]

    # The stub returns a c10d Backend; the wrapper is its own backend (see the class doc).
    def _get_backend(self, device: Any) -> _BackendWrapper:  # type: ignore[override]
        kind = torch.device(device).type
        if kind != self._device.type:
            # c10d's own words, so code that handles a plain group's refusal handles ours.
            raise RuntimeError(
                f"No backend type associated with device type {kind} (process group "
                f"{self._group_name!r} runs on {self._device.type} over torchcomms "
                f"communicator {self._comm.get_name()!r})"
            )
        return self

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    # c10d asks a group's backend whether it can shrink; the communicator cannot, and
    # neither can gloo.
    supports_shrinking = False

    def __getattr__(self, name: str) -> Any:
        """What c10d code reaches for on a group's backend and the wrapper does not
        define (gloo's ``create_device``, ``Device``, ``Options``, a vendor backend's
        own methods): the engine's attribute, as ``_get_backend(device)`` of a plain
        group would give it. Engine state the communicator must agree with (shrinking,
        suspending, the engine's allocator) is not handed out."""
        # Only reached when normal lookup failed; __dict__ keeps this free of recursion
        # while __init__ has not yet set the engine.
        engine = self.__dict__.get("_engine")
        if engine is None:
            engine = self.__dict__.get("_group_engine")
        if name.startswith("__") or engine is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name in _NOT_DELEGATED:
            raise AttributeError(
                f"{name!r} is not available on a torchcomms process group: it would change "
                f"the {self._backend_name} engine behind communicator "
                f"{self._comm.get_name()!r} without the communicator; use the "
                f"communicator's own operations (torchcomms) instead"
            )
        try:
            return getattr(engine, name)
        except AttributeError:
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute {name!r} (nor has its "
                f"engine, {type(engine).__name__})"
            ) from None

    def eager_connect_single_device(self, device: Any) -> None:
        """Nothing to do: torchcomms communicators connect when created."""

    def __repr__(self) -> str:
        return f"<_BackendWrapper {self._group_name!r} over {self._comm!r}>"

    # -- lifecycle -------------------------------------------------------------------

    def _set_default_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(timeout)

    def set_timeout(self, timeout: timedelta) -> None:
        self._comm.set_timeout(timeout)

    def abort(self) -> None:
        self.pending = None
        self._comm.abort()

    def shutdown(self) -> None:
        if self._group_engine is not None:
            _name_group_engine(self._group_engine, None)
        comm = self._comm
        if comm.is_finalized() or comm.is_aborted():
            self.pending = None  # nothing can run on it any more
        else:
            self.flush()
        comm.finalize()

    def split_group(
        self,
        new_ranks: Sequence[int],
        timeout: timedelta | None = None,
        opts: Any = None,
        group_name: str | None = None,
        group_desc: str | None = None,
        device_types: Any = None,
    ) -> _BackendWrapper | None:
        """Split the communicator; every rank of this group calls, non-members get ``None``."""
        self.flush()
        ranks = sorted(int(r) for r in new_ranks)
        # pg_options of new_group/split_group: a dict of hints (gloo's options give none);
        # anything else is refused before any rank splits.
        hints = hints_from_pg_options(self._comm.get_backend(), opts)
        if group_name is None:
            from torch.distributed import distributed_c10d

            group_name = distributed_c10d._process_group_name(ranks, use_hashed_name=True)
        if self.rank() not in ranks:
            self._comm.split([], group_name)
            return None
        # c10d names a split after its ranks, so the same ranks split twice (two
        # new_group calls) share a name; members count their splits alike, so each
        # communicator still gets a name of its own.
        seen = self._split_names.get(group_name, 0)
        self._split_names[group_name] = seen + 1
        comm_name = group_name if not seen else f"{group_name}.{seen}"
        child = self._comm.split(ranks, comm_name, hints=hints or None, timeout=timeout)
        assert child is not None  # members always get a communicator
        pg = _BackendWrapper(child)
        pg._set_group_name(group_name)
        pg._set_group_desc(group_desc or "undefined")
        parent = self._global_ranks or list(range(self.size()))
        pg._set_global_ranks([parent[r] for r in ranks])
        return pg

    def merge_remote_group(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "merge_remote_group is not supported by torchcomms process groups; create a "
            "communicator over the merged ranks with torchcomms.new_comm instead"
        )

    # -- plumbing (what bridge_ops' run functions use, see bridge_ops.Group) ----------

    def flush(self) -> None:
        """Issue a collected point-to-point batch before anything else runs."""
        pending = self.pending
        if pending is not None:
            self.pending = None
            # A batch_isend_irecv that stopped short raised in c10d before reaching us;
            # issuing its first half would leave peers waiting for the rest.
            if pending.expected is None or pending.full:
                pending.issue()

    def work(
        self,
        works: Sequence[Any],
        result: Any,
        then: Callable[[], None] | None = None,
        source_rank: int | Callable[[], int] = -1,
    ) -> CommWork:
        """The c10d ``Work`` of a general-path call (kept for its coalescing block)."""
        work = CommWork(works, result, then, source_rank)
        if self.coalescing is not None:
            self.coalescing.append(work)
        return work

    def _update_lane(self) -> None:
        """Recompute which lane calls take (the communicator changed: hooks, state,
        timeout or hints): ``_UNRECORDED`` (the engine, nothing observes the call), a
        flight recorder's track (the engine, recorded here: the recorder's hooks are the
        communicator's only ones), or ``None`` (the general path)."""
        comm = self._comm
        self._follow(comm)
        lane: Any = None
        if self._engine is not None and not self._stale:
            if comm.takes_lean_calls():
                lane = _UNRECORDED
            else:
                track = lane_track(comm)
                if track is not None and comm.takes_lean_calls(1):
                    lane = track
                    # c10d's recorder records the engine's operations for us when it
                    # keeps at least as many entries as ours and can tell this group's
                    # records apart: then a call only logs its name (see _Lane).
                    if self._engine_tagged and self._c10d_records >= max(
                        track.recorder.max_entries, 1
                    ):
                        lane = engine_lane(track, self._engine, self._engine_tags)
        self._lane_timeout = comm.get_timeout()
        self._lane_now = lane
        # Without an engine, plain calls go straight into the communicator's lean lane.
        lean = comm.lean_lane()
        engineless = self._engine is None and self._group_engine is None and not self._stale
        self._comm_calls = comm_lane.calls(lean) if engineless and lean is not None else None

    def _follow(self, comm: TorchComm) -> None:
        """Follow ``comm.reconfigure``: once the communicator is bound again, take its new
        engine when its rank and size are still this group's; otherwise mark the group
        stale, so its operations refuse to run (c10d's rank and size of a group are fixed:
        ``torchcomms.elastic.rebuild_process_group`` makes the group for the new membership).
        """
        if self._stale or not is_bound_and_usable(comm):  # between unbind and rebind: wait
            return
        engine = _c10d_engine(comm)
        if engine is self._engine:
            return
        rank, size = comm.get_rank(), comm.get_size()
        if (rank, size) != (self.rank(), self.size()):
            self._stale = (
                f"process group {self._group_name or comm.get_name()!r} was made for rank "
                f"{self.rank()} of {self.size()}, but its communicator {comm.get_name()!r} "
                f"was reconfigured to rank {rank} of {size}; make the group for the new "
                f"membership with torchcomms.elastic.rebuild_process_group(comm) and use that"
            )
            return
        self._engine = engine
        self._options = None
        self._engine_tags = set()
        self._engine_tagged = False
        if engine is None:
            return
        self._c10d_records = c10d_recorder_size() if _records_into_c10d(engine) else 0
        self._register_backend(self._device, _backend_type(self._backend_name), engine)
        self._name_engine(self._group_name or comm.get_name())
        if self._group_desc != "undefined":
            self._engine_names(desc=self._group_desc)

    def _lane(self) -> Any:
        """The lane this call may take (see ``_update_lane``): none while a coalescing
        block or a point-to-point batch collects calls."""
        if self.coalescing is not None or self.pending is not None:
            return None
        return self._lane_now

    def _engine_for_call(self) -> Any:
        """The engine when this call may take the engine lane unrecorded, else ``None``."""
        return self._engine if self._lane() is _UNRECORDED else None

    def _recorded_lane(self) -> Any:
        """The flight recorder's record of this call when the engine lane may take it
        (the recorder's hooks being the communicator's only ones): its track, or its
        ``_Lane`` when c10d records the engine's operations for it."""
        lane = self._lane()
        return None if lane is _UNRECORDED else lane

    def _recorded_call(
        self, op: BridgeOp, track: Any, what: tuple[str, Any, Any], args: Any, kwargs: Any
    ) -> Any:
        """An engine-lane call that the flight recorder records here (c10d's recorder
        cannot record it for us): a synchronous one is waited for here (c10d waits right
        after anyway) and recorded completed, an asynchronous one recorded with the
        engine's work to settle from."""
        method = getattr(self._engine, cast(str, op.engine))
        created = _time_ns()
        if not _profiler_enabled():
            work = method(*args, **kwargs)
        else:
            work = self._engine_recorded(op, method, args, kwargs)
        record = track.recorder.record_lane
        opts = kwargs.get("opts", args[-1] if args else None)
        if getattr(opts, "asyncOp", True):
            record(track, *what, work, self._lane_timeout, created, False)
            return work
        try:
            work.wait()
        except BaseException:
            record(track, *what, work, self._lane_timeout, created, False)
            raise
        record(track, *what, None, self._lane_timeout, created, True)
        return work

    def _engine_recorded(self, op: BridgeOp, method: Any, args: Any, kwargs: Any) -> Any:
        """An engine-lane call under the profiler: c10d's op record around the engine's
        call, which records its own work as a plain group's engine does."""
        rec = profiling.enter(op.record, op.record_inputs(*args, **kwargs))
        try:
            return method(*args, **kwargs)
        finally:
            profiling.exit(rec)

    def _general(self, op: BridgeOp, args: Any, kwargs: Any) -> CommWork:
        """A general-path call, under the records c10d and its engine would make."""
        if self._stale:
            raise CommStateError(f"{op.names[0]}: {self._stale}")
        if not _profiler_enabled():
            return op.run(self, *args, **kwargs)
        work = op.work if isinstance(op.work, str) else op.work(*args, **kwargs)
        name = f"{self._backend_name}:{work}"
        inputs = list(op.work_inputs(*args, **kwargs))
        works = [(name, (t,)) for t in inputs] if op.per_input else [(name, inputs)]
        rec = profiling.begin(op.record, op.record_inputs(*args, **kwargs), works)
        try:
            result = op.run(self, *args, **kwargs)
        except BaseException:
            if rec is not None:
                rec.issued()
                rec.done()
            raise
        if rec is not None:
            rec.issued()
            result.add_record(rec)
        return result

    def _start_coalescing(self, device: Any = None) -> None:
        self.flush()
        self.coalescing = []

    def _end_coalescing(self, device: Any = None) -> CommWork:
        works, self.coalescing = self.coalescing or [], None
        if _profiler_enabled():
            # Sends and receives of the block run now (torch 2.14's batch_isend_irecv
            # brackets our groups too); their records were written when each was called.
            with profiling.quiet():
                self.flush()
        else:
            self.flush()
        return CommWork(works, [t for w in works for t in w.result()])

    # -- operations: the methods are made from bridge_ops.OPS below -------------------

    def monitored_barrier(
        self, timeout: timedelta | None = None, wait_all_ranks: bool = False
    ) -> None:
        """gloo's ``monitoredBarrier``: rank 0 hears from every rank and names the late ones."""
        if self._stale:
            raise CommStateError(f"monitored_barrier: {self._stale}")
        engine = self._engine_for_call()
        if engine is None and self._recorded_lane() is not None:
            engine = self._engine  # c10d's flight recorder keeps no entry for it either
        limit = timeout if timeout is not None else self._comm.get_timeout()
        recorded = (barrier_tensor(0), *_NO_ARGS) if _profiler_enabled() else None
        if engine is not None and hasattr(engine, "monitored_barrier"):
            # The engine's own barrier: gloo's protocol, timeouts and words.
            engine_monitored_barrier(engine, limit, wait_all_ranks, recorded)
            return
        self.flush()
        profiled_monitored_barrier(self._comm, limit, wait_all_ranks, self._backend_name, recorded)


_NO_ARGS = (None,) * 4


def _method(op: BridgeOp) -> Callable[..., Any]:
    """The ``_BackendWrapper`` method of one table row: the engine lane, else the general
    path (see ``bridge_ops``)."""
    engine_name, accept, recorded_as = op.engine, op.engine_ok, op.recorded_as
    # The name a call logs when c10d's recorder records it (see recorder_lane._Lane).
    kind = getattr(recorded_as, "kind", None)
    c10d_name = op.names[0]

    if engine_name is None:

        def general(self: _BackendWrapper, *args: Any, **kwargs: Any) -> Any:
            return self._general(op, args, kwargs)

        general.__name__ = general.__qualname__ = op.names[0]
        general.__doc__ = op.run.__doc__
        return general

    def call(self: _BackendWrapper, *args: Any, **kwargs: Any) -> Any:
        lane = self._lane_now  # _BackendWrapper._lane, written out: every call runs it
        if lane is None:
            direct = self._comm_calls
            if (
                direct is not None
                and not kwargs
                and self.coalescing is None
                and self.pending is None
                and (fn := direct.get(c10d_name)) is not None
                and not _profiler_enabled()
                and (work := fn(*args)) is not None
            ):
                return work
            return self._general(op, args, kwargs)
        if (
            lane is not None
            and self.coalescing is None
            and self.pending is None
            and (accept is None or accept(*args, **kwargs))
        ):
            try:
                if lane is _UNRECORDED:
                    method = getattr(self._engine, engine_name)
                    if not _profiler_enabled():
                        return method(*args, **kwargs)
                    return self._engine_recorded(op, method, args, kwargs)
                if lane.__class__ is _Lane:
                    if kind is not None:
                        # c10d's recorder records the operation: the lane logs its name.
                        method = getattr(self._engine, engine_name)
                        if not _profiler_enabled():
                            work = method(*args, **kwargs)
                        else:
                            work = self._engine_recorded(op, method, args, kwargs)
                        seq = self._engine._get_sequence_number_for_group()
                        lane.log.append((next(lane.counter), kind, seq))
                        return work
                elif recorded_as is not None:
                    what = recorded_as(*args, **kwargs)
                    if what is not None:
                        return self._recorded_call(op, lane, what, args, kwargs)
            except TypeError as exc:
                # One of c10d's group-only overloads, which the engine does not bind:
                # refused before anything ran, so the general path takes it.
                if "incompatible function arguments" not in str(exc):
                    raise
        return self._general(op, args, kwargs)

    call.__name__ = call.__qualname__ = op.names[0]
    call.__doc__ = op.run.__doc__
    return call


for _op in OPS:
    _fn = _method(_op)
    for _name in _op.names:
        setattr(_BackendWrapper, _name, _fn)
del _op, _fn, _name


_guard_register_backend(_BackendWrapper, backend_adapter.ADAPTER)
# Flight-recorder dumps name a communicator's c10d group as torch.distributed knows it.
set_group_describer(describe)


def complete_registration() -> None:
    """Give ``torch.distributed`` the torchcomms names its import could not find.

    ``torch.distributed`` looks torchcomms up while it is imported. When our package is
    imported first (``import torchcomms`` before ``import torch``), torch is imported
    from inside ours, finds it half-initialised, and turns
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` off for the whole process. Called once our
    package is complete (``context.complete_torch_registration``), or when the bridge
    loads, this sets what torch's own lookup would have set, so a switch turned on at run
    time (``dist.config.use_torchcomms = True``) finds the bridge.
    """
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    # Not imported yet, or still importing (the flag is set at the end of its lookup):
    # torch's own lookup will run, or is running, against a complete package.
    if c10d is None or getattr(c10d, "_TORCHCOMM_AVAILABLE", True):
        return
    from torchcomms_core.comm.create import new_comm
    from torchcomms_core.hooks.flight_recorder import FlightRecorderHook
    from torchcomms_core.plugin_host.backends import is_backend_built, is_backend_registered

    c10d._BackendWrapper = _BackendWrapper
    c10d.new_comm = new_comm
    c10d.FlightRecorderHook = FlightRecorderHook
    if torch_compat.SWITCH_ASKS_BACKEND_BUILT:
        # Its failed lookup left stubs that route no name to us.
        c10d._torchcomms_is_backend_built = is_backend_built
        c10d._torchcomms_is_backend_registered = is_backend_registered
    c10d._TORCHCOMM_AVAILABLE = True


complete_registration()

#: The class's public name for other packages (torch looks up the reference's, in the face).
BackendWrapper = _BackendWrapper

__all__ = ["BackendWrapper", "_BackendWrapper", "complete_registration"]
