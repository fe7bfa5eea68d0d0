"""``ShmComm``: a shm communicator's life, and the parts of the backend it holds.

It owns the communicator's life (hints, the segment's creation and mapping, finalize,
abort, reconfigure), the worker thread that runs asynchronous collectives in issue order,
and the windows. It holds the backend's parts, made once and rebound to each new segment:
the :class:`~torchcomms_shm.lockstep.Lockstep` they share (the segment's words and slots,
the steps and the waiting), point-to-point (:mod:`~torchcomms_shm.p2p`), the collective
algorithms (:mod:`~torchcomms_shm.collectives`) and the small path
(:mod:`~torchcomms_shm.small`). The spec's methods (:mod:`~torchcomms_shm.backend`) call
the parts; the algorithms are described in the backend's module docstring.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``cma``, ``collectives``, ``lockstep``, ``p2p``, ``segment``, ``small`` and ``window``.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    CommInputError,
    CommOptions,
    StoredRankAndSize,
    TorchCommBackend,
    bool_hint,
    int_hint,
    launcher_local_ranks,
    read_record,
    usable_cores,
)

from . import cma
from . import segment as seg
from .collectives import Collectives
from .lockstep import Lockstep
from .p2p import PointToPoint
from .small import SmallCollectives

#: Hint: bytes of staging memory per rank (two halves; one chunk is half of it).
ARENA_BYTES = "arena_bytes"
DEFAULT_ARENA_BYTES = 1 << 20
#: The default with more ranks than cores, where every step of a staged collective waits
#: for the scheduler to run each rank, so fewer and larger steps pay: at 4 and 8 ranks on
#: 2 cores, 64 MiB collectives ran 1.0-2.4 times faster than with 1 MiB (docs/benchmarks.md).
#: Capped so the segment takes at most a quarter of the free space of ``/dev/shm``.
OVERSUBSCRIBED_ARENA_BYTES = 16 << 20
#: Hint: bytes of the ring each ordered pair of ranks uses for send/recv.
P2P_BYTES = "p2p_bytes"
DEFAULT_P2P_BYTES = 256 << 10
#: Hints: microseconds a waiting rank polls flat out, then polls yielding the CPU, before
#: it sleeps until woken. Defaults: 50 and 300 when every rank can have a core of its own;
#: with more ranks than cores, 0 and 1000 (a rank that polls keeps a core from the peer it
#: waits for; yielding hands it over at once, and sleeping costs a wake-up through the
#: scheduler; see docs/benchmarks.md for the measurement).
SPIN_US = "spin_us"
YIELD_US = "yield_us"
#: Hint: bytes per block from which an all-to-all with even splits reads each block
#: straight from its owner's tensor (cross-memory attach, one copy, two lockstep steps)
#: instead of staging it through the arena (two copies, a step per chunk); ``0``: never.
#: Default: 1 MiB (where every rank can read its peers). At 2 ranks with a core each,
#: 64 MiB all-to-alls ran at 0.99x MPICH's busbw reading directly against 0.84x staged
#: (#57, docs/benchmarks.md); with more ranks than cores every staged step waits for the
#: scheduler.
CMA_BYTES = "cma_bytes"
DEFAULT_CMA_BYTES = 1 << 20
#: Hint: bytes up to which all_reduce, broadcast and all_gather take the memoryview path
#: (``torchcomms_shm.small``; at most half a slot); ``0``: never. Each rank may choose
#: alone: both paths stage the same bytes in the same place in one step.
SMALL_PATH_BYTES = "small_bytes"
DEFAULT_SMALL_PATH_BYTES = 64 << 10
#: Hint: ``false`` keeps small all-reduces in Python rather than in the compiled helper
#: (``torchcomms_shm.native``; also ``TORCHCOMM_SHM_NATIVE=0``). Each rank may choose alone.
NATIVE = "native"


#: The fields of a rank's hello and of the segment record that the ranks read.
_HELLO = {"host": str, "arena": int, "arena_set": bool, "p2p": int}
_SEGMENT = {"name": str, "token": str}


def _hello(store: Any, rank: int) -> dict[str, Any]:
    key = f"shm/hello/{rank}"
    return read_record(store.get(key), key, _HELLO)


#: Hint (and environment variable ``TORCHCOMM_SHM_WAIT``): how ranks wait for each other.
#: ``spin``: poll, then yield, then sleep (a core per rank: a peer answers within
#: microseconds); ``yield``: hand the core over at once (ranks share cores: polling keeps a
#: core from the peer it waits for); ``auto`` (default): ``yield`` where the ranks on this
#: machine outnumber the cores this process may use. The ranks on this machine are the
#: launcher's count (``LOCAL_WORLD_SIZE``, Open MPI's, MPICH's, Slurm's) or, larger, this
#: communicator's size; the cores are its CPU affinity. ``spin_us``/``yield_us`` still set
#: the waiter's times exactly.
WAIT = "wait"
WAIT_VARIABLE = "TORCHCOMM_SHM_WAIT"


def ranks_share_cores(size: int, hints: dict[str, str]) -> bool:
    """Whether this communicator's ranks wait as ranks that share cores (the ``wait`` hint,
    ``TORCHCOMM_SHM_WAIT``, or ``auto``: the ranks on this machine against its cores).

    Raises:
        CommInputError: the hint or the variable is not ``auto``, ``spin`` or ``yield``.
    """
    where = f"hint {WAIT}" if WAIT in hints else WAIT_VARIABLE
    raw = hints[WAIT] if WAIT in hints else os.environ.get(WAIT_VARIABLE, "")
    choice = raw.strip().lower()
    if choice == "spin":
        return False
    if choice == "yield":
        return True
    if choice not in ("", "auto"):
        raise CommInputError(
            f"{where}={raw!r}: give spin (a core per rank), yield (ranks share cores) or auto"
        )
    return max(size, launcher_local_ranks() or 0) > usable_cores()


def default_arena(size: int, p2p_bytes: int, shared: bool | None = None) -> int:
    """The arena's bytes per rank when no hint or table sets them: 1 MiB, or
    :data:`OVERSUBSCRIBED_ARENA_BYTES` where ranks share cores (``shared``; by default,
    more ranks than cores), at most what keeps the segment within a quarter of the free
    space of ``/dev/shm`` (never below 1 MiB)."""
    if not (size > usable_cores() if shared is None else shared):
        return DEFAULT_ARENA_BYTES
    try:
        st = os.statvfs(seg.SHM_DIR)
        free = st.f_bavail * st.f_frsize
    except OSError:
        return DEFAULT_ARENA_BYTES
    room = (free // 4 - size * size * p2p_bytes) // size
    arena = min(OVERSUBSCRIBED_ARENA_BYTES, room)
    arena -= arena % (2 * seg.PAGE)
    return max(DEFAULT_ARENA_BYTES, arena)


def default_wait(size: int, shared: bool | None = None) -> tuple[int, int]:
    """``(spin_us, yield_us)`` for ``size`` ranks: ``(0, 1000)`` where they share cores
    (``shared``; by default, more ranks than the cores this process may use), else
    ``(50, 300)``."""
    if size > usable_cores() if shared is None else shared:
        return (0, 1000)
    return (50, 300)


#: Hint (and environment variable ``TORCHCOMM_SHM_HOST_ID``): this rank's host identity,
#: in place of ``hostname/boot_id`` (tests simulate ranks on two hosts with it).
HOST_ID = "host_id"
HOST_ID_ENV = "TORCHCOMM_SHM_HOST_ID"


def host_identity(hints: dict[str, str]) -> str:
    """This rank's host: ``hostname/boot_id``, or the ``host_id`` hint / environment override."""
    override = hints.get(HOST_ID) or os.environ.get(HOST_ID_ENV, "")
    if override:
        return override
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = "?"
    return f"{socket.gethostname()}/{boot}"


class ShmComm(StoredRankAndSize, TorchCommBackend):
    """The lifecycle, worker and windows of a shm communicator, and the parts it holds
    (see the module docstring)."""

    def __init__(self) -> None:
        # Unbound (``enable_reconfigure=True`` before the first reconfigure): no segment.
        self._rank, self._size = -1, 0
        #: The state every part shares, and the parts, made once: each segment rebinds them.
        self._lockstep = state = Lockstep()
        self._p2p = PointToPoint(state)
        self._coll = Collectives(state)
        self._small = SmallCollectives(state)
        # A rank that waits for a step keeps its queued sends and receives moving.
        state.on_alarm = self._p2p.advance
        self._windows: list[Any] = []
        #: Whether every rank can read its peers' memory, and the all-to-all block size
        #: from which it does (``0``: never); the tuners' default rules read both.
        self._cma_ok = False
        self._cma = 0

    # -- lifecycle --------------------------------------------------------------------

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        self._setup(options.store, options.rank, options.size, options)

    def reconfigure_engine(
        self, store: Any, rank: int, size: int, timeout: timedelta, options: CommOptions
    ) -> None:
        """A fresh segment for the new membership, over the uuid-scoped store the core passes."""
        self._release(abort=True)
        self._setup(store, rank, size, options.replace(timeout=timeout))

    def _setup(self, store: Any, rank: int, size: int, options: CommOptions) -> None:
        hints = options.hints or {}
        tuned = self.tuning.choose("arena", 0, torch.uint8).params["arena_bytes"]  # (#45)
        p2p = int_hint(hints, P2P_BYTES, DEFAULT_P2P_BYTES, minimum=seg.PAGE)
        # The arena is this rank's own default unless a hint or a tuning table set it (a
        # table's 1 MiB reads as the default); the ranks then take the smallest default
        # (each may see another free space in /dev/shm).
        arena_set = (
            ARENA_BYTES in hints
            or any(key.startswith("algorithm.arena") for key in hints)
            or int(tuned) != DEFAULT_ARENA_BYTES
        )
        shared = ranks_share_cores(size, hints)
        if arena_set:
            arena = int_hint(
                hints, ARENA_BYTES, max(int(tuned), 2 * seg.PAGE), minimum=2 * seg.PAGE
            )
        else:
            arena = default_arena(size, p2p, shared)
        spin0, yield0 = default_wait(size, shared)
        spin = int_hint(hints, SPIN_US, spin0)
        yld = int_hint(hints, YIELD_US, yield0)
        cma_bytes = int_hint(hints, CMA_BYTES, DEFAULT_CMA_BYTES)
        small_limit = int_hint(hints, SMALL_PATH_BYTES, DEFAULT_SMALL_PATH_BYTES)
        native_wanted = bool_hint(hints, NATIVE, True)
        arena -= arena % (2 * seg.PAGE)
        p2p -= p2p % seg.PAGE
        self._rank, self._size = rank, size
        self._kv = store
        # Asynchronous collectives, run in issue order by one worker thread.
        self._jobs: deque[_Job] = deque()
        self._jobs_lock = threading.Lock()
        self._jobs_cv = threading.Condition(self._jobs_lock)
        self._worker: threading.Thread | None = None
        self._stop = False
        self._windows = []
        #: Whether the ranks wait as ranks that share cores (``ranks_share_cores``).
        self._shared_cores = shared
        st = self._lockstep
        waiter = seg.Waiter(spin * 1e-6, yld * 1e-6, seg.Futex(), st.set_sleeping)
        if SPIN_US not in hints and YIELD_US not in hints:
            # Other jobs keep every core busy: sleep at once (docs/benchmarks.md).
            waiter.busy = seg.BusyMachine(size, usable_cores())
        timeout = options.timeout or timedelta(seconds=600)
        # Polls before the waiter takes over (its clock and checks cost more than a poll);
        # none with more ranks than cores, where polling keeps a core from a peer.
        st.start(rank, size, waiter, 1 if shared else 200, timeout.total_seconds())

        me = {
            "host": host_identity(hints),
            "pid": os.getpid(),
            "start": seg.own_start_time(),
            "arena": arena,
            "arena_set": arena_set,
            "p2p": p2p,
            "cma": cma_bytes,
        }
        store.set(f"shm/hello/{rank}", json.dumps(me))
        everyone = [_hello(store, r) for r in range(size)]
        hosts: dict[str, list[int]] = {}
        for r, info in enumerate(everyone):
            hosts.setdefault(info["host"], []).append(r)
        if len(hosts) > 1:
            listing = "; ".join(f"{h}: ranks {rs}" for h, rs in hosts.items())
            raise CommInputError(
                f"the shm backend needs every rank on one host, but the ranks are on "
                f"{len(hosts)} hosts ({listing}); use backend 'gloo' (TCP between hosts) or "
                f"'hier' (shm inside each host, another backend between hosts)"
            )
        if not any(info["arena_set"] for info in everyone):
            arena = min(int(info["arena"]) for info in everyone)
            for info in everyone:
                info["arena"] = arena
        sizes = {(info["arena"], info["p2p"]) for info in everyone}
        if len(sizes) > 1:
            raise CommInputError(
                f"the ranks passed different shm hints {ARENA_BYTES}/{P2P_BYTES} "
                f"({sorted(sizes)}); pass the same values on every rank"
            )
        layout = seg.Layout(size, arena, p2p)

        # Rank 0 names the segment before creating it, so any rank can remove it if
        # creation or mapping fails half way.
        if rank == 0:
            name = seg.segment_name()
            token = os.urandom(16).hex()
            store.set("shm/segment", json.dumps({"name": name, "token": token}))
        else:
            info = read_record(store.get("shm/segment"), "shm/segment", _SEGMENT)
            name, token = info["name"], info["token"]
        self._segname = name
        try:
            if rank == 0:
                mapping = seg.Mapping(name, layout, create=True)
                mapping.raw[:32].copy_(
                    torch.frombuffer(bytearray(token.encode()), dtype=torch.uint8)
                )
                store.set("shm/created", "1")
            else:
                store.get("shm/created")
                try:
                    mapping = seg.Mapping(name, layout, create=False)
                except FileNotFoundError:
                    raise CommInputError(
                        f"rank {rank} cannot open the shared segment {seg.SHM_DIR}/{name} rank "
                        f"0 created: the ranks report one host but do not share {seg.SHM_DIR} "
                        f"(separate containers?); use backend 'gloo' or 'hier'"
                    ) from None
                if bytes(mapping.map[:32]) != token.encode():
                    mapping.close()
                    raise CommInputError(
                        f"rank {rank} sees a different {seg.SHM_DIR}/{name} than rank 0 "
                        f"created (separate containers?); use backend 'gloo' or 'hier'"
                    )
            liveness = seg.Liveness(
                {r: (info["pid"], info["start"]) for r, info in enumerate(everyone) if r != rank}
            )
            st.bind(mapping, layout, liveness)
            self._p2p.reset()
            self._coll.reset()
            self._small.reset(small_limit, native_wanted)
            w = st.words
            probe = ctypes.create_string_buffer(token.encode(), len(token))
            w[layout.rank_word(rank, seg.W_PROBE)] = ctypes.addressof(probe)
            w[layout.rank_word(rank, seg.W_READY)] = 1
            # Everyone mapped: the name can go, whoever gets there first.
            ready_words = [layout.rank_word(r, seg.W_READY) for r in range(size)]
            st.deadline = time.monotonic() + st.default_s
            st.op = "init"
            waiter.wait(lambda: all(w[i] for i in ready_words), st.deadline, st.alarm)
            st.pids = [int(info["pid"]) for info in everyone]
            # Probed whatever the threshold, so a tuner may choose direct reads (#45).
            self._cma_ok = st.cma_ok = self._agree_cma(1, probe.raw) > 0
            self._cma = min(int(info["cma"]) for info in everyone) if self._cma_ok else 0
            del probe
        finally:
            seg.unlink_quietly(name)

    def _agree_cma(self, cma_bytes: int, token: bytes) -> int:
        """Probe cross-memory reads of every peer; the block size from which every rank uses
        them (``0``: off, because a rank turned them off or could not read a peer)."""
        st = self._lockstep
        lay, w = st.layout, st.words
        ok = cma_bytes > 0 and all(
            cma.probe(st.pids[p], w[lay.rank_word(p, seg.W_PROBE)], token) for p in st.peers
        )
        w[lay.rank_word(st.rank, seg.W_CMA)] = 1 if ok else 2
        words = [lay.rank_word(r, seg.W_CMA) for r in range(st.size)]
        st.waiter.wait(lambda: all(w[i] for i in words), st.deadline, st.alarm)
        return cma_bytes if all(w[i] == 1 for i in words) else 0

    def finalize(self) -> None:
        self._release(abort=False)

    def abort(self) -> None:
        """Fail every wait of this communicator at once (here and, through the segment, in
        the peers), and release it."""
        self._lockstep.abort()
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        self._stop_worker(drain=not abort)
        for window in list(self._windows):
            window.free(abort=True)
        self._windows = []
        st = self._lockstep
        liveness = st.liveness
        if liveness is not None:
            liveness.close()
            st.liveness = None
        mapping = st.mapping
        if mapping is None:
            return
        lock = st.lock
        if abort and not lock.acquire(blocking=False):
            # Another thread is inside an operation: it sees the abort within milliseconds
            # and fails; the mapping goes when its last view does.
            st.mapping = None
            return
        try:
            st.unbind()
            self._small.drop_views()
            mapping.close()
        finally:
            if abort:
                lock.release()

    def get_backend_name(self) -> str:
        return "shm"

    # -- the worker ---------------------------------------------------------------------

    def _run(
        self, what: str, timeout: timedelta | None, async_op: bool, body: Callable[[], None]
    ) -> Any:
        """Run a collective: here when synchronous and nothing is queued, else in order on
        the communicator's worker thread (``async_op``: return its work at once)."""
        if not async_op and not self._jobs:
            st = self._lockstep
            with st.lock:
                st.begin(what, timeout)
                body()
            return None
        job = _Job(what, timeout, body)
        with self._jobs_lock:
            self._jobs.append(job)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._work_loop, name=f"torchcomms-shm-{self.comm_name}", daemon=True
                )
                self._worker.start()
            self._jobs_cv.notify()
        if async_op:
            return job
        job.wait()
        return None

    def _work_loop(self) -> None:
        st = self._lockstep
        while True:
            with self._jobs_lock:
                while not self._jobs and not self._stop:
                    self._jobs_cv.wait()
                if self._stop and not self._jobs:
                    self._worker = None
                    return
                job = self._jobs[0]
            try:
                with st.lock:
                    st.begin(job.what, job.timeout)
                    job.body()
            except BaseException as exc:  # handed to whoever waits on the work
                job.error = exc
            with self._jobs_lock:
                self._jobs.popleft()
            job.done.set()

    def _stop_worker(self, drain: bool) -> None:
        worker = getattr(self, "_worker", None)
        if worker is None:
            return
        with self._jobs_lock:
            self._stop = True
            self._jobs_cv.notify()
        if drain and worker is not threading.current_thread():
            worker.join()

    # -- windows ----------------------------------------------------------------------

    def new_window(self) -> Any:
        """A window engine on shared memory (see ``torchcomms_shm.window``)."""
        from .window import ShmWindowEngine

        self._windows_made = getattr(self, "_windows_made", 0) + 1
        engine = ShmWindowEngine(self, self._lockstep, self._kv, self._windows_made)
        self._windows.append(engine)
        return engine


class _Job:
    """An asynchronous collective: queued, run by the worker thread, waited on by the user."""

    __slots__ = ("what", "timeout", "body", "done", "error")

    def __init__(self, what: str, timeout: timedelta | None, body: Callable[[], None]) -> None:
        self.what, self.timeout, self.body = what, timeout, body
        self.done = threading.Event()
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self.done.is_set() and self.error is None

    def wait(self) -> bool:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return True
