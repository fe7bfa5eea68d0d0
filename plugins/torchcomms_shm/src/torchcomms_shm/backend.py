"""``ShmBackend``: collectives through one shared-memory segment for ranks on one host.

Collectives are lockstep over a staging *arena*: each rank owns a slot of ``arena_bytes``
in two halves; a large message moves through it in chunks of half a slot, alternating
halves, so a rank fills one half while its peers still read the other. Each chunk is one
*step*: every rank writes what it contributes into its own slot, publishes its step
counter, waits until every peer published the same step, then reads what it needs from
the peers' slots. A rank publishes step ``k`` only after finishing its reads of step
``k - 1``, so once it has seen every peer at step ``k`` it may reuse the half of step
``k - 1``. Reductions run on torch's kernels over the staged chunks, in rank order, by
one owner rank per part; every rank copies the owners' results, so results are identical
on every rank.

Point-to-point uses one byte ring per ordered pair of ranks (single writer, single reader;
a bytes-written and a bytes-read counter). Operations are queued per channel and advanced
by whoever waits, so asynchronous sends never block on the receiver.
"""

from __future__ import annotations

import ctypes
import json
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core.plugin import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    BatchOp,
    CommInputError,
    CommOperationError,
    CommOptions,
    RedOpType,
    ReduceOp,
    TorchCommBackend,
    int_hint,
)

from . import segment as seg

#: Hint: bytes of staging memory per rank (two halves; one chunk is half of it).
ARENA_BYTES = "arena_bytes"
DEFAULT_ARENA_BYTES = 8 << 20
#: Hint: bytes of the ring each ordered pair of ranks uses for send/recv.
P2P_BYTES = "p2p_bytes"
DEFAULT_P2P_BYTES = 256 << 10
#: Hints: microseconds a waiting rank polls flat out, then polls yielding the CPU, before
#: it naps between polls. Defaults: 50 and 300 when every rank can have a core of its own;
#: with more ranks than cores, 20 and 0 (nap at once: a rank that polls or yields keeps a
#: core from the peer it waits for; see docs/benchmarks.md for the measurement).
SPIN_US = "spin_us"
YIELD_US = "yield_us"


def default_wait(size: int) -> tuple[int, int]:
    """``(spin_us, yield_us)`` for ``size`` ranks on the cores this process may use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return (50, 300) if size <= cores else (20, 0)


#: Hint (and environment variable ``TORCHCOMM_SHM_HOST_ID``): this rank's host identity,
#: in place of ``hostname/boot_id`` (tests simulate ranks on two hosts with it).
HOST_ID = "host_id"
HOST_ID_ENV = "TORCHCOMM_SHM_HOST_ID"
#: Messages up to this size per rank (bytes) take the one-step all-reduce.
SMALL_BYTES = 64 << 10

_REDUCE: dict[RedOpType, Callable[..., torch.Tensor]] = {
    RedOpType.SUM: torch.add,
    RedOpType.PRODUCT: torch.mul,
    RedOpType.MIN: torch.minimum,
    RedOpType.MAX: torch.maximum,
    RedOpType.BAND: torch.bitwise_and,
    RedOpType.BOR: torch.bitwise_or,
    RedOpType.BXOR: torch.bitwise_xor,
}


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


def _fold(fn: Callable[..., torch.Tensor], sources: list[torch.Tensor], out: torch.Tensor) -> None:
    """``out = sources[0] op sources[1] op ...`` in list order.

    ``out`` must not overlap any source but the first two (it is written first).
    """
    if len(sources) == 1:
        if sources[0].data_ptr() != out.data_ptr():
            _copy(out, sources[0])
        return
    fn(sources[0], sources[1], out=out)
    for src in sources[2:]:
        fn(out, src, out=out)


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


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + b.nbytes and pb < pa + a.nbytes and a.nbytes > 0 and b.nbytes > 0


class ShmBackend(TorchCommBackend):
    """CPU communicator over POSIX shared memory for ranks that share one host."""

    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = DEFAULT_DTYPES
    supported_reduce_ops = BASIC_REDUCE_OPS
    hint_keys: ClassVar[tuple[str, ...] | None] = (
        ARENA_BYTES,
        P2P_BYTES,
        SPIN_US,
        YIELD_US,
        HOST_ID,
    )

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        return seg.arch_supported()

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
        arena = int_hint(hints, ARENA_BYTES, DEFAULT_ARENA_BYTES, minimum=2 * seg.PAGE)
        p2p = int_hint(hints, P2P_BYTES, DEFAULT_P2P_BYTES, minimum=seg.PAGE)
        spin0, yield0 = default_wait(size)
        spin = int_hint(hints, SPIN_US, spin0)
        yld = int_hint(hints, YIELD_US, yield0)
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
        self._waiter = seg.Waiter(spin * 1e-6, yld * 1e-6)
        timeout = options.timeout or timedelta(seconds=600)
        self._default_s = timeout.total_seconds()

        me = {
            "host": host_identity(hints),
            "pid": os.getpid(),
            "start": seg.own_start_time(),
            "arena": arena,
            "p2p": p2p,
        }
        store.set(f"shm/hello/{rank}", json.dumps(me))
        everyone = [json.loads(store.get(f"shm/hello/{r}")) for r in range(size)]
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
            info = json.loads(store.get("shm/segment"))
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
            self._w[layout.rank_word(rank, seg.W_READY)] = 1
            # Everyone mapped: the name can go, whoever gets there first.
            ready_words = [layout.rank_word(r, seg.W_READY) for r in range(size)]
            self._deadline = time.monotonic() + self._default_s
            self._op = "init"
            w = self._w
            self._waiter.wait(lambda: all(w[i] for i in ready_words), self._deadline, self._alarm)
        finally:
            seg.unlink_quietly(name)

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
        self._peer_steps = [lay.rank_word(r, seg.W_STEP) for r in range(n) if r != me]
        self._peers = [r for r in range(n) if r != me]
        self._abort_words = [lay.rank_word(r, seg.W_ABORT) for r in range(n) if r != me]
        # Point to point: per channel a ring and its two counters, plus queued operations.
        self._ring = lay.p2p_bytes
        self._send_q: list[deque[_P2P]] = [deque() for _ in range(n)]
        self._recv_q: list[deque[_P2P]] = [deque() for _ in range(n)]
        self._sent = [0] * n  # bytes this rank wrote into channel me -> p
        self._got = [0] * n  # bytes this rank read from channel p -> me
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
            except (ValueError, TypeError):  # already released
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
            mapping.close()
        finally:
            if abort:
                self._lock.release()

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._size

    def get_backend_name(self) -> str:
        return "shm"

    def get_comm_name(self) -> str:
        return self.comm_name

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
        self._w[self._my_step] = self._step

    def _wait_peers(self) -> None:
        """Wait until every peer published this rank's current step."""
        target = self._step
        w = self._w
        idx = self._peer_steps
        for _ in range(200):
            for i in idx:
                if w[i] < target:
                    break
            else:
                return
        self._waiter.wait(lambda: all(w[i] >= target for i in idx), self._deadline, self._alarm)

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

    # -- collectives ------------------------------------------------------------------

    def barrier(
        self,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self._run("barrier", timeout, async_op, self._sync)

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        flat, fn = tensor.view(-1), _REDUCE[op.type]
        return self._run("all_reduce", timeout, async_op, lambda: self._all_reduce(flat, fn))

    def lean_calls(self, timeout: timedelta, hints: dict[str, str]) -> dict[str, Any]:
        """The synchronous ``all_reduce`` for the core's lean lane (small tensors skip the
        keyword handling of the method; the work is the same)."""
        seconds = timeout.total_seconds()

        def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
            if self._jobs:  # asynchronous collectives still queued: in order behind them
                return self.all_reduce(tensor, op, False, timeout=timeout, hints=hints)
            with self._lock:
                if self._aborted or self._broken is not None or self._mapping is None:
                    self._begin("all_reduce", timeout)  # raises the reason
                self._op, self._seconds = "all_reduce", seconds
                self._deadline = time.monotonic() + seconds
                self._all_reduce(tensor.view(-1), _REDUCE[op.type])
            return None

        return {"all_reduce": all_reduce}

    def _all_reduce(self, flat: torch.Tensor, fn: Callable[..., torch.Tensor]) -> None:
        n, me = self._size, self._rank
        if n == 1:
            return
        dtype, es = flat.dtype, flat.element_size()
        total = flat.numel()
        if total * es <= min(SMALL_BYTES, self._chunk):
            # One step: every rank stages its whole tensor and folds all of them itself.
            h = self._half()
            key = (dtype, total, h)
            slots = self._views.get(key)
            if slots is None:
                if len(self._views) > 64:
                    self._views.clear()
                slots = self._views[key] = [
                    self._slots[r][h][: total * es].view(dtype) for r in range(n)
                ]
            _copy(slots[me], flat)
            self._sync()
            _fold(fn, slots, flat)
            return
        per = self._chunk // es
        for start in range(0, total, per):
            m = min(per, total - start)
            bounds = [m * p // n for p in range(n + 1)]
            lo, hi = bounds[me], bounds[me + 1]
            h = self._half()
            slots = [self._slots[r][h][: m * es].view(dtype) for r in range(n)]
            chunk = flat[start : start + m]
            mine = slots[me]
            # Stage every part but this rank's own (which it reduces from its tensor).
            if lo:
                _copy(mine[:lo], chunk[:lo])
            if hi < m:
                _copy(mine[hi:], chunk[hi:])
            self._sync()
            own = chunk[lo:hi]
            # Into this rank's own (free) region of its slot, then back into the tensor.
            _fold(fn, [own if r == me else slots[r][lo:hi] for r in range(n)], mine[lo:hi])
            _copy(own, mine[lo:hi])
            self._sync()
            for r in self._peers:
                a, b = bounds[r], bounds[r + 1]
                if b > a:
                    _copy(chunk[a:b], slots[r][a:b])

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.reduce_scatter_v(output, input_list, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        blocks = (
            list(input.view(-1).chunk(self._size))
            if input.numel()
            else [input.view(-1)] * self._size
        )
        return self.reduce_scatter_v(output, blocks, op, async_op, timeout=timeout, hints=hints)

    def reduce_scatter_v(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        ins = [t.reshape(-1) for t in input_list]
        out = output.view(-1)
        if any(_overlap(out, t) for t in ins):
            ins = [t.clone() for t in ins]
        fn = _REDUCE[op.type]
        return self._run(
            "reduce_scatter", timeout, async_op, lambda: self._reduce_scatter(out, ins, fn)
        )

    def _reduce_scatter(
        self, out: torch.Tensor, ins: list[torch.Tensor], fn: Callable[..., torch.Tensor]
    ) -> None:
        n, me = self._size, self._rank
        if n == 1:
            _copy(out, ins[0])
            return
        dtype, es = out.dtype, out.element_size()
        # Elements per destination per step: a slot holds one region per peer (the one
        # for a destination ``p`` at ``_place(p, owner)``).
        region = self._chunk // (n - 1) // es
        steps = max(-(-t.numel() // region) for t in ins)
        for k in range(steps):
            lo = k * region
            h = self._half()
            base = self._slots
            for p in self._peers:
                m = min(region, ins[p].numel() - lo)
                if m > 0:
                    at = _place(p, me) * region
                    dst = base[me][h][at * es : (at + m) * es].view(dtype)
                    _copy(dst, ins[p][lo : lo + m])
            self._sync()
            m = min(region, out.numel() - lo)
            if m > 0:
                srcs = [
                    ins[me][lo : lo + m]
                    if r == me
                    else base[r][h][
                        _place(me, r) * region * es : (_place(me, r) * region + m) * es
                    ].view(dtype)
                    for r in range(n)
                ]
                _fold(fn, srcs, out[lo : lo + m])

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.all_gather_v(tensor_list, tensor, async_op, timeout=timeout, hints=hints)

    def all_gather_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        flat = output.view(-1)
        outs = list(flat.chunk(self._size)) if flat.numel() else [flat] * self._size
        return self.all_gather_v(outs, input, async_op, timeout=timeout, hints=hints)

    def all_gather_v(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        outs = [_u8(t) for t in tensor_list]
        mine = _u8(tensor)
        if any(_overlap(o, mine) for i, o in enumerate(outs) if i != self._rank):
            mine = mine.clone()
        return self._run("all_gather", timeout, async_op, lambda: self._all_gather(outs, mine))

    def _all_gather(self, outs: list[torch.Tensor], mine: torch.Tensor) -> None:
        n, me, c = self._size, self._rank, self._chunk
        local = outs[me].data_ptr() != mine.data_ptr()
        if n == 1:
            if local:
                _copy(outs[me], mine)
            return
        steps = max(-(-o.numel() // c) for o in outs)
        for k in range(steps):
            lo = k * c
            h = self._half()
            m = min(c, mine.numel() - lo)
            if m > 0:
                _copy(self._slots[me][h][:m], mine[lo : lo + m])
            self._post()
            if local and m > 0:  # this rank's own block, while the peers catch up
                _copy(outs[me][lo : lo + m], mine[lo : lo + m])
            self._wait_peers()
            for p in self._peers:
                m = min(c, outs[p].numel() - lo)
                if m > 0:
                    _copy(outs[p][lo : lo + m], self._slots[p][h][:m])

    def broadcast(
        self,
        tensor: torch.Tensor,
        root: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        data = _u8(tensor)
        return self._run("broadcast", timeout, async_op, lambda: self._broadcast(data, root))

    def _broadcast(self, data: torch.Tensor, root: int) -> None:
        if self._size == 1:
            return
        c, me, total = self._chunk, self._rank, data.numel()
        steps = -(-total // c)
        for k in range(steps):
            lo = k * c
            m = min(c, total - lo)
            h = self._half()
            slot = self._slots[root][h][:m]
            if me == root:
                _copy(slot, data[lo : lo + m])
            self._sync()
            if me != root:
                _copy(data[lo : lo + m], slot)

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        outs = [_u8(t) for t in output_tensor_list]
        ins = [_u8(t) for t in input_tensor_list]
        if any(_overlap(o, i) for o in outs for i in ins):
            ins = [t.clone() for t in ins]
        return self._run("all_to_all", timeout, async_op, lambda: self._all_to_all(outs, ins))

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.all_to_all_v_single(
            output, input, [], [], async_op, timeout=timeout, hints=hints
        )

    def all_to_all_v_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int],
        input_split_sizes: list[int],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        n = self._size
        outs = _blocks(output, output_split_sizes, n)
        ins = _blocks(input, input_split_sizes, n)
        return self.all_to_all(outs, ins, async_op, timeout=timeout, hints=hints)

    def _all_to_all(self, outs: list[torch.Tensor], ins: list[torch.Tensor]) -> None:
        n, me = self._size, self._rank
        if n == 1:
            _copy(outs[me], ins[me])
            return
        region = self._chunk // (n - 1) // 64 * 64
        local = max(-(-t.numel() // region) for t in outs + ins)
        # The step count is announced in one of two words, by the parity of the first
        # step: a peer reaches a later step of that parity only after this rank posted the
        # step in between, which it does after reading the count.
        word = seg.W_COUNT + ((self._use + 1) & 1)
        count_word = self._layout.rank_word(me, word)
        peer_counts = [self._layout.rank_word(p, word) for p in self._peers]
        w = self._w
        w[count_word] = local  # read by the peers once they see this step
        k, steps = 0, 1
        while k < steps:
            lo = k * region
            h = self._half()
            mine = self._slots[me][h]
            for p in self._peers:
                m = min(region, ins[p].numel() - lo)
                if m > 0:
                    at = _place(p, me) * region
                    _copy(mine[at : at + m], ins[p][lo : lo + m])
            self._post()
            m = min(region, outs[me].numel() - lo)
            if m > 0:  # this rank's own block, while the peers catch up
                _copy(outs[me][lo : lo + m], ins[me][lo : lo + m])
            self._wait_peers()
            if k == 0:
                steps = max([local] + [w[i] for i in peer_counts])
            for p in self._peers:
                m = min(region, outs[p].numel() - lo)
                if m > 0:
                    at = _place(me, p) * region
                    _copy(outs[p][lo : lo + m], self._slots[p][h][at : at + m])
            k += 1

    # -- point to point ---------------------------------------------------------------

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.batch_op_issue([("send", tensor, dst)], async_op, timeout=timeout, hints=hints)

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        return self.batch_op_issue([("recv", tensor, src)], async_op, timeout=timeout, hints=hints)

    def batch_op_issue(
        self,
        ops: Sequence[BatchOp],
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        with self._lock:
            self._begin(
                "batch_op_issue" if len(ops) > 1 else ops[0][0] if ops else "batch", timeout
            )
            posted = []
            for kind, tensor, peer in ops:
                item = _P2P(kind == "send", _u8(tensor), peer)
                if item.send and peer == self._rank:
                    raise CommInputError(f"send to this rank itself ({peer}); pick another rank")
                (self._send_q if item.send else self._recv_q)[peer].append(item)
                self._npending += 1
                posted.append(item)
            self._progress()
        work = _P2PWork(self, posted, self._op, self._seconds)
        if async_op:
            return work
        work.wait()
        return None

    _in_progress = False

    def _progress(self) -> bool:
        """Advance the first queued send and receive of every channel; ``True`` if any moved."""
        if self._mapping is None:
            return False
        self._in_progress = True
        try:
            moved = False
            for p in range(self._size):
                q = self._send_q[p]
                while q and self._push(q[0]):
                    q.popleft()
                    self._npending -= 1
                    moved = True
                q = self._recv_q[p]
                while q and self._pull(q[0]):
                    q.popleft()
                    self._npending -= 1
                    moved = True
            return moved
        finally:
            self._in_progress = False

    def _ring_base(self, src: int, dst: int) -> int:
        lay = self._layout
        return lay.rings + (src * self._size + dst) * lay.p2p_bytes

    def _push(self, item: _P2P) -> bool:
        """Write what fits of ``item`` into channel me -> peer; ``True`` once all is written.

        On the wire a message is an 8-byte header (its byte count), the bytes, and padding
        to a multiple of 8, so every header sits 8-aligned and never wraps.
        """
        me, p, size = self._rank, item.peer, self._ring
        w, lay = self._w, self._layout
        mapping = self._mapping
        assert mapping is not None
        tail = w[lay.tail_word(me, p)]
        head = self._sent[p]
        base = self._ring_base(me, p)
        while item.done < item.wire:
            free = size - (head - tail)
            pos = head % size
            if item.done == 0:
                if free < 8:
                    break
                mapping.map[base + pos : base + pos + 8] = item.total.to_bytes(8, "little")
                head += 8
                item.done = 8
                continue
            if free <= 0:
                break
            m = min(free, size - pos, item.wire - item.done)
            lo, hi = item.done - 8, min(item.done - 8 + m, item.total)
            if hi > lo:
                _copy(mapping.raw[base + pos : base + pos + hi - lo], item.data[lo:hi])
            head += m
            item.done += m
        if head != self._sent[p]:
            self._sent[p] = head
            w[lay.head_word(me, p)] = head
        return item.done == item.wire

    def _pull(self, item: _P2P) -> bool:
        """Read what has arrived of ``item`` from channel peer -> me; ``True`` once complete."""
        me, p, size = self._rank, item.peer, self._ring
        w, lay = self._w, self._layout
        mapping = self._mapping
        assert mapping is not None
        head = w[lay.head_word(p, me)]
        tail = self._got[p]
        base = self._ring_base(p, me)
        while item.done < item.wire:
            avail = head - tail
            if avail <= 0:
                break
            pos = tail % size
            if item.done == 0:  # a header is written whole before the head moves past it
                sent = int.from_bytes(mapping.map[base + pos : base + pos + 8], "little")
                if sent != item.total:
                    raise self._fail(
                        CommInputError(
                            f"recv from rank {p} expects {item.total} bytes but rank {p} sent "
                            f"{sent}; post receives of the sent size and dtype"
                        )
                    )
                tail += 8
                item.done = 8
                continue
            m = min(avail, size - pos, item.wire - item.done)
            lo, hi = item.done - 8, min(item.done - 8 + m, item.total)
            if hi > lo:
                _copy(item.data[lo:hi], mapping.raw[base + pos : base + pos + hi - lo])
            tail += m
            item.done += m
        if tail != self._got[p]:
            self._got[p] = tail
            w[lay.tail_word(p, me)] = tail
        return item.done == item.wire

    # -- windows ----------------------------------------------------------------------

    def new_window(self) -> Any:
        """A window engine on shared memory (see ``torchcomms_shm.window``)."""
        from .window import ShmWindowEngine

        self._windows_made = getattr(self, "_windows_made", 0) + 1
        engine = ShmWindowEngine(self, self._windows_made)
        self._windows.append(engine)
        return engine


def _place(dst: int, owner: int) -> int:
    """Index of ``dst``'s region in ``owner``'s slot (one region per peer of ``owner``)."""
    return dst if dst < owner else dst - 1


def _blocks(t: torch.Tensor, split_sizes: list[int], n: int) -> list[torch.Tensor]:
    if t.dim() == 0:
        t = t.view(1)
    if not split_sizes:
        rows = t.shape[0] // n
        split_sizes = [rows] * n
    return [b.reshape(-1) for b in torch.split(t, list(split_sizes), dim=0)]


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


class _P2P:
    """One queued send or receive: its bytes, and how many wire bytes moved (header, data,
    padding to 8)."""

    __slots__ = ("send", "data", "peer", "done", "total", "wire")

    def __init__(self, send: bool, data: torch.Tensor, peer: int) -> None:
        self.send, self.data, self.peer = send, data, peer
        self.done = 0
        self.total = data.numel()
        self.wire = 8 + (self.total + 7) // 8 * 8


class _P2PWork:
    """Waits for a set of queued sends and receives, advancing every channel meanwhile."""

    def __init__(self, backend: ShmBackend, items: list[_P2P], what: str, seconds: float) -> None:
        self._b, self._items, self._what, self._seconds = backend, items, what, seconds
        self._deadline = time.monotonic() + seconds

    def is_completed(self) -> bool:
        if all(i.done == i.wire for i in self._items):
            return True
        b = self._b
        if b._lock.acquire(blocking=False):
            try:
                if b._mapping is not None and b._broken is None and not b._aborted:
                    b._progress()
            finally:
                b._lock.release()
        return all(i.done == i.wire for i in self._items)

    def wait(self) -> bool:
        b, items = self._b, self._items

        def ready() -> bool:
            if all(i.done == i.wire for i in items):
                return True
            with b._lock:
                if b._aborted or b._mapping is None:
                    return True  # the alarm below reports it
                b._progress()
            return all(i.done == i.wire for i in items)

        if ready():
            return True
        with b._lock:
            b._op, b._seconds, b._deadline = self._what, self._seconds, self._deadline
        b._waiter.wait(ready, self._deadline, self._alarm)
        if b._aborted or b._mapping is None:
            raise CommOperationError(f"{self._what}: the communicator was aborted while waiting")
        return True

    def _alarm(self, final: bool) -> None:
        b = self._b
        with b._lock:
            b._op, b._seconds = self._what, self._seconds
            if final:
                peers = sorted({i.peer for i in self._items if i.done != i.wire})
                raise b._fail(seg.timeout_error(self._what, self._seconds, peers))
            b._alarm(False)
