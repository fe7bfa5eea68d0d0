"""``ShmComm``: the shm backend's shared segment and the lockstep every operation uses.

It owns the communicator's life (hints, the segment's creation and mapping, finalize,
abort, reconfigure), the waiting (steps published and awaited, with abort, dead-peer and
timeout checks), the worker thread that runs asynchronous collectives in issue order, and
the windows. Point-to-point (:mod:`~torchcomms_shm.p2p`), the collective algorithms
(:mod:`~torchcomms_shm.collectives`) and the spec's methods (:mod:`~torchcomms_shm.backend`)
are the layers above it; the algorithms are described in the backend's module docstring.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``measured``, ``segment`` and ``window``.
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
    CommOperationError,
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
from .measured import Meter

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


#: ``memmove`` (one thread, glibc's memcpy) or ``torch`` (``Tensor.copy_``, which splits
#: large copies over torch's intra-op threads).
_COPY_WITH = os.environ.get("TORCHCOMM_SHM_COPY", "memmove")


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    """Copy ``src`` into ``dst``: contiguous, same dtype and size (one ``memmove``)."""
    if _COPY_WITH == "torch":
        dst.copy_(src)
        return
    nbytes = src.nbytes
    if nbytes:
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)


def _u8(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor's bytes as a flat uint8 view."""
    return t.reshape(-1).view(torch.uint8)


class ShmComm(StoredRankAndSize, TorchCommBackend):
    """The segment, lifecycle, waiting and worker of a shm communicator (module docstring)."""

    #: Point-to-point operations queued and not complete, and whether they are being
    #: advanced now (the point-to-point layer, ``ShmP2P``, queues and advances them).
    _npending = 0
    _in_progress = False

    def __init__(self) -> None:
        # Unbound (``enable_reconfigure=True`` before the first reconfigure): no segment.
        self._rank, self._size = -1, 0
        self._mapping: seg.Mapping | None = None
        self._aborted = False
        self._broken: str | None = None

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
        self._small_limit = int_hint(hints, SMALL_PATH_BYTES, DEFAULT_SMALL_PATH_BYTES)
        self._native_wanted = bool_hint(hints, NATIVE, True)
        arena -= arena % (2 * seg.PAGE)
        p2p -= p2p % seg.PAGE
        self._rank, self._size = rank, size
        self._kv = store
        self._lock = threading.RLock()
        # Asynchronous collectives, run in issue order by one worker thread.
        self._jobs: deque[_Job] = deque()
        self._jobs_lock = threading.Lock()
        self._jobs_cv = threading.Condition(self._jobs_lock)
        self._worker: threading.Thread | None = None
        self._stop = False
        self._aborted = False
        self._broken = None
        self._mapping = None
        self._liveness: seg.Liveness | None = None
        self._windows: list[Any] = []
        # Polls before the waiter takes over (its clock and checks cost more than a poll);
        # none with more ranks than cores, where polling keeps a core from a peer.
        self._fast_polls = 1 if shared else 200
        #: Whether the ranks wait as ranks that share cores (``ranks_share_cores``).
        self._shared_cores = shared
        self._waiter = seg.Waiter(spin * 1e-6, yld * 1e-6, seg.Futex(), self._set_sleeping)
        if SPIN_US not in hints and YIELD_US not in hints:
            # Other jobs keep every core busy: sleep at once (docs/benchmarks.md).
            self._waiter.busy = seg.BusyMachine(size, usable_cores())
        timeout = options.timeout or timedelta(seconds=600)
        self._default_s = timeout.total_seconds()

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
        self._layout = layout

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
            self._mapping = mapping
            self._w = mapping.words
            self._liveness = seg.Liveness(
                {r: (info["pid"], info["start"]) for r, info in enumerate(everyone) if r != rank}
            )
            self._init_state()
            w = self._w
            probe = ctypes.create_string_buffer(token.encode(), len(token))
            w[layout.rank_word(rank, seg.W_PROBE)] = ctypes.addressof(probe)
            w[layout.rank_word(rank, seg.W_READY)] = 1
            # Everyone mapped: the name can go, whoever gets there first.
            ready_words = [layout.rank_word(r, seg.W_READY) for r in range(size)]
            self._deadline = time.monotonic() + self._default_s
            self._op = "init"
            self._waiter.wait(lambda: all(w[i] for i in ready_words), self._deadline, self._alarm)
            self._pids = [int(info["pid"]) for info in everyone]
            # Probed whatever the threshold, so a tuner may choose direct reads (#45).
            self._cma_ok = self._agree_cma(1, probe.raw) > 0
            self._cma = min(int(info["cma"]) for info in everyone) if self._cma_ok else 0
            del probe
        finally:
            seg.unlink_quietly(name)

    def _agree_cma(self, cma_bytes: int, token: bytes) -> int:
        """Probe cross-memory reads of every peer; the block size from which every rank uses
        them (``0``: off, because a rank turned them off or could not read a peer)."""
        lay, me, w = self._layout, self._rank, self._w
        ok = cma_bytes > 0 and all(
            cma.probe(self._pids[p], w[lay.rank_word(p, seg.W_PROBE)], token) for p in self._peers
        )
        w[lay.rank_word(me, seg.W_CMA)] = 1 if ok else 2
        words = [lay.rank_word(r, seg.W_CMA) for r in range(self._size)]
        self._waiter.wait(lambda: all(w[i] for i in words), self._deadline, self._alarm)
        return cma_bytes if all(w[i] == 1 for i in words) else 0

    def _init_state(self) -> None:
        n, me, lay = self._size, self._rank, self._layout
        mapping = self._mapping
        assert mapping is not None
        raw = mapping.raw
        half = lay.half
        self._chunk = half
        self._slots = [
            [
                raw[
                    lay.arena + r * lay.arena_bytes + h * half : lay.arena
                    + r * lay.arena_bytes
                    + (h + 1) * half
                ]
                for h in (0, 1)
            ]
            for r in range(n)
        ]
        self._step = 0
        self._use = 0
        self._my_step = lay.rank_word(me, seg.W_STEP)
        self._control_at = mapping.base + lay.control
        self._my_sleep = lay.rank_word(me, seg.W_SLEEP)
        self._sleep_words = [lay.rank_word(r, seg.W_SLEEP) for r in range(n) if r != me]
        self._my_step_at = self._control_at + 8 * self._my_step
        self._peer_steps = [lay.rank_word(r, seg.W_STEP) for r in range(n) if r != me]
        #: Per half: this rank's word announcing a one-step all-reduce's bytes, and the
        #: peers' (each rank checks them after the step: ``_size_mismatch``).
        self._my_size = [lay.rank_word(me, seg.W_SIZE + h) for h in (0, 1)]
        self._peer_sizes = [
            [lay.rank_word(r, seg.W_SIZE + h) for r in range(n) if r != me] for h in (0, 1)
        ]
        self._peers = [r for r in range(n) if r != me]
        self._abort_words = [lay.rank_word(r, seg.W_ABORT) for r in range(n) if r != me]
        #: Rank 0's word naming the path of a ``measured`` call, and rank 0's timings.
        self._choice_of_0 = lay.rank_word(0, seg.W_CHOICE)
        self._meter = Meter()
        #: The piece buffers of the last direct all-reduce (``_all_reduce_direct``).
        self._direct_temps: dict[tuple[torch.dtype, int, int], list[torch.Tensor]] = {}
        self._npending = 0
        #: Slot views of recent small all-reduces, by (dtype, numel, half).
        self._views: dict[tuple[torch.dtype, int, int], list[torch.Tensor]] = {}
        self._op = ""
        self._deadline = 0.0

    def finalize(self) -> None:
        self._release(abort=False)

    def abort(self) -> None:
        """Fail every wait of this communicator at once (here and, through the segment, in
        the peers), and release it."""
        self._aborted = True
        mapping = getattr(self, "_mapping", None)
        if mapping is not None and self._broken is None:
            try:
                self._w[self._layout.rank_word(self._rank, seg.W_ABORT)] = 1
                # Wake whoever sleeps on a step word (a thread of this process, or a peer
                # waiting for this rank), so that it sees the abort now.
                futex = self._waiter.futex
                if futex is not None:
                    for r in range(self._size):
                        futex.wake(self._control_at + 8 * self._layout.rank_word(r, seg.W_STEP))
            except (ValueError, TypeError, AttributeError):  # released or never bound
                pass
        self._release(abort=True)

    def _release(self, abort: bool) -> None:
        self._stop_worker(drain=not abort)
        for window in list(getattr(self, "_windows", [])):
            window.free(abort=True)
        self._windows = []
        liveness = getattr(self, "_liveness", None)
        if liveness is not None:
            liveness.close()
            self._liveness = None
        mapping = getattr(self, "_mapping", None)
        if mapping is None:
            return
        if abort and not self._lock.acquire(blocking=False):
            # Another thread is inside an operation: it sees the abort within milliseconds
            # and fails; the mapping goes when its last view does.
            self._mapping = None
            return
        try:
            self._mapping = None
            self._slots = []
            self._views = {}
            self._drop_views()
            mapping.close()
        finally:
            if abort:
                self._lock.release()

    def _drop_views(self) -> None:
        """Let go of the memoryviews over the segment (the small collectives' layer)."""

    def get_backend_name(self) -> str:
        return "shm"

    # -- waiting ----------------------------------------------------------------------

    def _begin(self, what: str, timeout: timedelta | None) -> None:
        if self._aborted:
            raise CommOperationError(f"{what}: the shm communicator was aborted; create a new one")
        if self._broken is not None:
            raise CommOperationError(
                f"{what}: the shm communicator failed earlier ({self._broken}); abort it and "
                f"create a new one (or reconfigure)"
            )
        if self._mapping is None:
            raise CommOperationError(f"{what}: the shm communicator was finalized")
        seconds = timeout.total_seconds() if timeout is not None else self._default_s
        self._op = what
        self._seconds = seconds
        self._deadline = time.monotonic() + seconds

    def _alarm(self, final: bool) -> None:
        """Raise if this communicator was aborted, a peer aborted or died, or (``final``) the
        deadline passed; otherwise advance pending point-to-point operations."""
        what = self._op
        if self._aborted:
            raise self._fail(CommOperationError(f"{what}: aborted while waiting"))
        w = self._w
        gone = [r for r, i in zip(self._peers, self._abort_words, strict=True) if w[i]]
        if gone and self._waiter.satisfied():
            return  # the peer published what this rank waited for before it went
        if gone:
            raise self._fail(
                CommOperationError(
                    f"{what}: rank(s) {gone} aborted the communicator; abort it here too"
                )
            )
        liveness = self._liveness
        dead = liveness.dead() if liveness is not None else []
        if dead and self._waiter.satisfied():
            return
        if dead:
            raise self._fail(
                CommOperationError(
                    f"{what}: rank(s) {dead} exited (killed or crashed) while this rank waited "
                    f"for them; abort this communicator and create a new one (or reconfigure)"
                )
            )
        if final:
            raise self._fail(seg.timeout_error(what, self._seconds, self._lagging()))
        if self._npending and not self._in_progress:
            self._progress()

    def _size_mismatch(self, h: int, nbytes: int) -> CommInputError | None:
        """After a one-step all-reduce's step in half ``h``: the error to raise if a peer
        announced another size than ``nbytes`` (every rank finds it after the same step,
        so all of them raise and the communicator stays in step)."""
        w = self._w
        for r, i in zip(self._peers, self._peer_sizes[h], strict=True):
            if w[i] != nbytes:
                return CommInputError(
                    f"{self._op or 'all_reduce'}: rank {r} passed {w[i]} bytes where rank "
                    f"{self._rank} passed {nbytes}; every rank must pass the same size"
                )
        return None

    def _lagging(self) -> list[int]:
        w = self._w
        return [r for r, i in zip(self._peers, self._peer_steps, strict=True) if w[i] < self._step]

    def _fail(self, exc: Exception) -> Exception:
        """Remember ``exc`` as the reason this communicator is unusable; return it."""
        self._broken = str(exc)
        return exc

    def _sync(self) -> None:
        """Publish the next step and wait until every peer published it."""
        self._post()
        self._wait_peers()

    def _post(self) -> None:
        """Publish the next step (what this rank staged for it is in place)."""
        self._step += 1
        w = self._w
        w[self._my_step] = self._step
        for i in self._sleep_words:
            if w[i]:  # a peer sleeps on some step word: wake whoever sleeps on this one
                self._waiter.futex.wake(self._my_step_at)  # type: ignore[union-attr]
                break

    def _set_sleeping(self, on: int) -> None:
        self._w[self._my_sleep] = on

    def _wait_peers(self) -> None:
        """Wait until every peer published this rank's current step."""
        target = self._step
        w = self._w
        idx = self._peer_steps
        for _ in range(self._fast_polls):
            for i in idx:
                if w[i] < target:
                    break
            else:
                return
        self._waiter.wait(
            lambda: all(w[i] >= target for i in idx), self._deadline, self._alarm, self._sleep_on
        )

    def _sleep_on(self) -> tuple[int, int] | None:
        """The first peer step word still behind this rank's step: its address and value."""
        w, target = self._w, self._step
        for i in self._peer_steps:
            seen = w[i]
            if seen < target:
                return self._control_at + 8 * i, seen
        return None

    def _run(
        self, what: str, timeout: timedelta | None, async_op: bool, body: Callable[[], None]
    ) -> Any:
        """Run a collective: here when synchronous and nothing is queued, else in order on
        the communicator's worker thread (``async_op``: return its work at once)."""
        if not async_op and not self._jobs:
            with self._lock:
                self._begin(what, timeout)
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
        while True:
            with self._jobs_lock:
                while not self._jobs and not self._stop:
                    self._jobs_cv.wait()
                if self._stop and not self._jobs:
                    self._worker = None
                    return
                job = self._jobs[0]
            try:
                with self._lock:
                    self._begin(job.what, job.timeout)
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

    def _half(self) -> int:
        self._use += 1
        return self._use & 1

    def _progress(self) -> bool:
        """Advance the queued point-to-point operations; ``True`` if any moved.

        The point-to-point layer (``ShmP2P``) queues them and overrides this.
        """
        return False

    # -- windows ----------------------------------------------------------------------

    def new_window(self) -> Any:
        """A window engine on shared memory (see ``torchcomms_shm.window``)."""
        from .window import ShmWindowEngine

        self._windows_made = getattr(self, "_windows_made", 0) + 1
        engine = ShmWindowEngine(self, self._windows_made)
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
