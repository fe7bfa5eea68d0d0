"""The communicator's shared segment, its control words and the wait loop.

One file in ``/dev/shm`` per communicator, created by rank 0, mapped by every rank and
unlinked as soon as every rank has mapped it (so nothing is left behind even if a rank
is SIGKILLed later). Layout::

    [header page: a random token rank 0 writes and the others check]
    [control: one 128-byte line of int64 words per rank, then one line per p2p channel
     head and one per p2p channel tail]
    [arena: one slot of ``arena_bytes`` per rank, in two halves]
    [p2p rings: ``p2p_bytes`` per ordered pair of ranks]

Every control word has exactly one writer. Data is written with torch copies (or
``memmove``) before the writer stores the word that publishes it, and readers load the
word before the data. This relies on x86-64's total store order (stores become visible
in program order, loads are not reordered with older loads); the GIL's atomic operations
between two Python statements are full fences there as well. On weaker memory models
(ARM) a fence would be needed; ``is_available`` refuses other architectures.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import secrets
import select
import threading
import time
from collections.abc import Callable

import torch

from torchcomms_core.plugin import CommOperationError, CommTimeoutError

SHM_DIR = "/dev/shm"
PAGE = 4096
#: int64 words per control line (128 bytes: two cache lines, so neighbours never share one).
LINE = 16
# Words of a rank's own line.
W_STEP = 0  # collective step counter
W_READY = 1  # 1 once the rank has mapped the segment
W_ABORT = 2  # 1 once the rank aborted the communicator
W_COUNT = 3  # words 3 and 4: a count announced with a step (all_to_all's chunk count)
W_PROBE = 5  # address of a private buffer holding the segment's token (cross-memory probe)
W_CMA = 6  # 1 once the rank could read every peer's probe buffer, 2 if it could not
W_SLEEP = 7  # 1 while the rank sleeps on a peer's step word (the peers wake it)
W_CHOICE = 8  # rank 0: the path of the current ``measured`` call (1 staged, 2 direct)
W_SIZE = 9  # words 9 and 10: a one-step all-reduce's bytes, by the parity of its half


def arch_supported() -> tuple[bool, str]:
    """Whether this machine's memory model is the one the flags rely on (x86-64)."""
    machine = platform.machine().lower()
    if machine not in ("x86_64", "amd64"):
        return False, (
            f"the shm backend relies on x86-64 store ordering; this machine is {machine}. "
            f"Use the gloo backend"
        )
    if not os.path.isdir(SHM_DIR):
        return False, f"{SHM_DIR} does not exist (no POSIX shared memory); use the gloo backend"
    return True, "ok"


def segment_name() -> str:
    """A fresh, unguessable segment file name."""
    return f"torchcomms-shm-{os.getpid()}-{secrets.token_hex(8)}"


def unlink_quietly(name: str) -> None:
    """Remove ``/dev/shm/<name>`` if it is still there."""
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except OSError:
        pass


class Layout:
    """Byte offsets of every region for ``size`` ranks."""

    def __init__(self, size: int, arena_bytes: int, p2p_bytes: int) -> None:
        self.size = size
        self.arena_bytes = arena_bytes
        self.half = arena_bytes // 2
        self.p2p_bytes = p2p_bytes
        self.control = PAGE
        control_bytes = 8 * LINE * (size + 2 * size * size)
        self.arena = PAGE + _round(control_bytes, PAGE)
        self.rings = self.arena + size * arena_bytes
        self.total = self.rings + size * size * p2p_bytes

    def rank_word(self, rank: int, word: int) -> int:
        """Index (in int64 words from the control region) of ``word`` of ``rank``'s line."""
        return rank * LINE + word

    def head_word(self, src: int, dst: int) -> int:
        """Index of the bytes-written counter of channel ``src -> dst`` (written by ``src``)."""
        return (self.size + src * self.size + dst) * LINE

    def tail_word(self, src: int, dst: int) -> int:
        """Index of the bytes-read counter of channel ``src -> dst`` (written by ``dst``)."""
        return (self.size + self.size * self.size + src * self.size + dst) * LINE


def _round(n: int, unit: int) -> int:
    return (n + unit - 1) // unit * unit


class Mapping:
    """The mapped segment: ``words`` (control, as Python ints) and ``raw`` (uint8 tensor)."""

    def __init__(self, name: str, layout: Layout, create: bool) -> None:
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, layout.total)
            elif os.fstat(fd).st_size != layout.total:
                raise CommOperationError(
                    f"shared segment {path} has {os.fstat(fd).st_size} bytes, expected "
                    f"{layout.total}: the ranks passed different arena_bytes/p2p_bytes hints; "
                    f"pass the same hints on every rank"
                )
            self.map = mmap.mmap(fd, layout.total)
        finally:
            os.close(fd)
        self.raw = torch.frombuffer(self.map, dtype=torch.uint8)
        ctl_end = layout.arena
        self.words = memoryview(self.map)[layout.control : ctl_end].cast("q")
        self.base = self.raw.data_ptr()

    def close(self) -> None:
        """Drop the views and unmap (left to the garbage collector if a view survives)."""
        try:
            self.words.release()
        except Exception:  # a released or still-exported view: nothing more to do
            pass
        self.raw = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:  # a tensor still views it; the mapping goes with that tensor
            pass


class _Timespec(ctypes.Structure):
    _fields_ = [("sec", ctypes.c_long), ("nsec", ctypes.c_long)]


class Futex:
    """Sleep on a control word until its publisher wakes it (``futex(2)``, shared form).

    A futex on a ``MAP_SHARED`` file mapping is keyed by the file and offset, so a
    process blocked in :meth:`wait` on a peer's step word is woken by that peer's
    :meth:`wake` on its own mapping of the same word. The kernel compares the word's low
    32 bits (little-endian) with the value the waiter last saw before it sleeps, so a
    publish between the check and the sleep is never missed. Waits are bounded (the
    waiter's checks of abort, peers and deadline go on).
    """

    _SYS_FUTEX = 202  # x86-64
    _WAIT, _WAKE = 0, 1

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self._ts = _Timespec(0, 0)
        self._ts_ref = ctypes.byref(self._ts)
        self._all = ctypes.c_int(0x7FFFFFFF)

    def wait(self, address: int, seen: int, seconds: float) -> None:
        """Sleep while the word at ``address`` still holds ``seen``, at most ``seconds``."""
        ts = self._ts
        ts.sec = int(seconds)
        ts.nsec = int((seconds - ts.sec) * 1e9)
        self._syscall(
            self._SYS_FUTEX,
            ctypes.c_void_p(address),
            self._WAIT,
            ctypes.c_uint(seen & 0xFFFFFFFF),
            self._ts_ref,
            None,
            0,
        )

    def wake(self, address: int) -> None:
        """Wake every process sleeping on the word at ``address``."""
        self._syscall(
            self._SYS_FUTEX, ctypes.c_void_p(address), self._WAKE, self._all, None, None, 0
        )


class Liveness:
    """Whether peers still run: a pidfd per peer, readable once that process has exited."""

    def __init__(self, peers: dict[int, tuple[int, str]]) -> None:
        """``peers``: rank -> (pid, process start time from ``/proc/<pid>/stat``)."""
        self._fds: dict[int, int] = {}
        self._ranks: dict[int, int] = {}
        self._poll = select.poll()
        for rank, (pid, start) in peers.items():
            if _start_time(pid) != start:
                continue  # another pid namespace (or already gone): only the timeout guards it
            try:
                fd = os.pidfd_open(pid)
            except OSError:
                continue
            self._fds[rank] = fd
            self._ranks[fd] = rank
            self._poll.register(fd, select.POLLIN)

    def dead(self) -> list[int]:
        """Ranks whose process has exited."""
        if not self._fds:
            return []
        return sorted(self._ranks[fd] for fd, _ in self._poll.poll(0))

    def close(self) -> None:
        """Close the pidfds."""
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        self._ranks.clear()


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return ""
    # Field 22 (start time), counted after the parenthesised command name.
    return stat[stat.rfind(")") + 2 :].split()[19]


def own_start_time() -> str:
    """This process's start time (clock ticks since boot), to tell pid reuse apart."""
    return _start_time(os.getpid())


class BusyMachine:
    """Whether other work keeps every core busy: the load average, less this
    communicator's own ranks, at least the cores (read at most every ``_EVERY_S``).

    On such a machine a polling or yielding rank competes with the other jobs for the
    core its peer needs (``sched_yield`` hands it to any of them), while a rank that sleeps
    on a futex is woken by its peer and scheduled promptly: with a busy loop on each of 2
    cores, an 8-byte all-reduce at 2 ranks took 78 us sleeping at once against 298 us
    with the default policy, and 64 MiB ran at 1.29 times its bandwidth.
    """

    _EVERY_S = 0.5

    def __init__(self, ranks: int, cores: int) -> None:
        self._ranks = ranks
        self._cores = cores
        self._at = -1.0
        self._busy = False

    def __call__(self, now: float) -> bool:
        """Whether the machine is busy (``now``: ``time.monotonic()``)."""
        if now - self._at >= self._EVERY_S:
            self._at = now
            try:
                self._busy = os.getloadavg()[0] - self._ranks >= self._cores
            except OSError:
                self._busy = False
        return self._busy


class Waiter:
    """The wait policy: spin, then yield the CPU, then sleep; checks abort, peers and deadline.

    ``spin_s``: poll flat out this long (a peer that runs on another core answers within
    microseconds). ``yield_s``: then poll with ``sched_yield`` between polls until this long
    after the start, which hands the core to a runnable peer when there are more ranks than
    cores. After that, sleep until woken on the word it waits for (a futex) or, where the
    wait names none, nap ``_NAP_S`` (growing to ``_NAP_MAX_S``) between polls, so a rank
    left waiting a long time costs nothing.
    """

    _NAP_S = 50e-6
    _NAP_MAX_S = 1e-3
    #: Seconds between two liveness checks of the peers.
    _CHECK_S = 2e-3

    def __init__(
        self,
        spin_s: float,
        yield_s: float,
        futex: Futex | None = None,
        sleeping: Callable[[int], None] | None = None,
    ) -> None:
        self.spin_s = spin_s
        self.yield_s = yield_s
        #: A wait that names a word to sleep on blocks on it with ``futex`` instead of
        #: napping, after announcing it with ``sleeping(1)`` (``sleeping(0)`` once awake),
        #: so that its publisher knows to wake it.
        self.futex = futex
        self._sleeping = sleeping
        self._local = threading.local()
        #: When set and it answers True, waits skip polling and yielding and sleep at once.
        self.busy: Callable[[float], bool] | None = None

    def satisfied(self) -> bool:
        """Whether the condition this thread waits for holds now (for an alarm that found a
        peer gone: it may have published what was awaited just before it went)."""
        ready = getattr(self._local, "ready", None)
        return ready is not None and bool(ready())

    def wait(
        self,
        ready: Callable[[], bool],
        deadline: float,
        alarm: Callable[[bool], None],
        sleep_on: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        """Return once ``ready()``; ``alarm(final)`` raises on abort or dead peers.

        ``sleep_on()``: the address and last seen value of a word whose publisher wakes
        its sleepers, to block on (with :class:`Futex`) instead of napping.

        ``alarm(False)`` is called every ``_CHECK_S`` (it may also make progress on pending
        point-to-point operations); past ``deadline``, ``ready`` is checked one last time
        and then ``alarm(True)`` raises the timeout.
        """
        self._local.ready = ready
        start = now = time.monotonic()
        busy = self.busy
        if busy is not None and busy(now):
            spin_until = yield_until = start
        else:
            spin_until = start + self.spin_s
            yield_until = spin_until + self.yield_s
        check_at = start + self._CHECK_S
        nap = self._NAP_S
        while True:
            for _ in range(64 if now < spin_until else 1):
                if ready():
                    return
            now = time.monotonic()
            if now >= check_at:
                alarm(False)
                check_at = now + self._CHECK_S
                if now >= deadline:
                    if ready():
                        return
                    alarm(True)
            if now < spin_until:
                continue
            if now < yield_until:
                os.sched_yield()
                continue
            futex = self.futex
            target = sleep_on() if futex is not None and sleep_on is not None else None
            if target is not None and self._sleeping is not None:
                self._sleeping(1)
                try:
                    # Re-checked after the announcement: a publisher that stored its word
                    # before seeing the announcement did not wake this rank.
                    if ready():
                        return
                    futex.wait(target[0], target[1], max(check_at - now, 1e-5))  # type: ignore[union-attr]
                finally:
                    self._sleeping(0)
            else:
                time.sleep(nap)
                nap = min(nap * 2, self._NAP_MAX_S)


def timeout_error(what: str, seconds: float, waiting_for: list[int]) -> CommTimeoutError:
    """The timeout raised when peers did not arrive within the operation's timeout."""
    return CommTimeoutError(
        f"{what} timed out after {seconds:g} s waiting for rank(s) {waiting_for}; every rank "
        f"must call the same collectives in the same order (raise the timeout if they are "
        f"just slow)"
    )
