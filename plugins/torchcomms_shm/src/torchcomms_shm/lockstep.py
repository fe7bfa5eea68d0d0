"""``Lockstep``: what every part of a shm communicator shares, and the steps they take.

One object per communicator holds the segment as the parts see it (rank, size, layout,
control words, arena slots), the step counters, the running operation's name and deadline,
and the waiting: steps published and awaited, with abort, dead-peer and timeout checks.
The backend (``comm``) binds it to each segment it maps; each part (``p2p``,
``collectives``, ``small``) takes it in its constructor and runs its steps through it.

May import: torch, the standard library, ``torchcomms_core.plugin`` and this package's
``segment``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch

from torchcomms_core.plugin import CommInputError, CommOperationError

from . import segment as seg


def _nothing() -> None:
    """What an alarm does beyond its checks until a part asks for more."""


class Lockstep:
    """The shared state and the steps of one shm communicator (see the module docstring).

    Before :meth:`start` it is unbound (``mapping`` is ``None``): every operation's
    :meth:`begin` refuses to run.
    """

    #: Filled by :meth:`start` (the waiting) and :meth:`bind` (the segment's views).
    waiter: seg.Waiter
    layout: seg.Layout
    words: memoryview
    control_at: int

    def __init__(self) -> None:
        self.rank, self.size = -1, 0
        self.mapping: seg.Mapping | None = None
        self.aborted = False
        #: Why the communicator is unusable (a failed wait), or ``None``.
        self.broken: str | None = None
        #: Held while an operation runs on the segment.
        self.lock = threading.RLock()
        #: The running operation's name, timeout and deadline (what a timeout reports).
        self.op = ""
        self.seconds = 0.0
        self.deadline = 0.0
        #: The timeout of operations that pass none.
        self.default_s = 600.0
        #: This rank's last published step, and the halves of the slots used so far.
        self.step = 0
        self.use = 0
        #: Polls before the waiter takes over.
        self.fast_polls = 200
        self.liveness: seg.Liveness | None = None
        #: Every rank's process id, and whether every rank can read its peers' memory.
        self.pids: list[int] = []
        self.cma_ok = False
        #: Called by :meth:`alarm` while a wait goes on (point-to-point progress).
        self.on_alarm: Callable[[], object] = _nothing
        self.chunk = 0
        #: Per rank, its slot's two halves as uint8 tensors.
        self.slots: list[list[torch.Tensor]] = []
        #: Slot views of recent small all-reduces, by (dtype, numel, half).
        self.views: dict[tuple[torch.dtype, int, int], list[torch.Tensor]] = {}
        self.peers: list[int] = []

    def start(
        self, rank: int, size: int, waiter: seg.Waiter, fast_polls: int, default_s: float
    ) -> None:
        """Ready for a new segment of ``size`` ranks (not yet mapped: :meth:`bind`)."""
        self.rank, self.size = rank, size
        self.lock = threading.RLock()
        self.aborted = False
        self.broken = None
        self.mapping = None
        self.liveness = None
        self.waiter = waiter
        self.fast_polls = fast_polls
        self.default_s = default_s

    def bind(self, mapping: seg.Mapping, layout: seg.Layout, liveness: seg.Liveness) -> None:
        """Take the mapped segment: its control words, its slots and each rank's words."""
        n, me = self.size, self.rank
        self.mapping = mapping
        self.layout = layout
        self.words = mapping.words
        self.liveness = liveness
        raw = mapping.raw
        half = layout.half
        self.chunk = half
        self.slots = [
            [
                raw[
                    layout.arena + r * layout.arena_bytes + h * half : layout.arena
                    + r * layout.arena_bytes
                    + (h + 1) * half
                ]
                for h in (0, 1)
            ]
            for r in range(n)
        ]
        self.step = 0
        self.use = 0
        self.my_step = layout.rank_word(me, seg.W_STEP)
        self.control_at = mapping.base + layout.control
        self.my_sleep = layout.rank_word(me, seg.W_SLEEP)
        self.sleep_words = [layout.rank_word(r, seg.W_SLEEP) for r in range(n) if r != me]
        self.my_step_at = self.control_at + 8 * self.my_step
        self.peer_steps = [layout.rank_word(r, seg.W_STEP) for r in range(n) if r != me]
        #: Per half: this rank's word announcing a one-step all-reduce's bytes, and the
        #: peers' (each rank checks them after the step: :meth:`size_mismatch`).
        self.my_size = [layout.rank_word(me, seg.W_SIZE + h) for h in (0, 1)]
        self.peer_sizes = [
            [layout.rank_word(r, seg.W_SIZE + h) for r in range(n) if r != me] for h in (0, 1)
        ]
        self.peers = [r for r in range(n) if r != me]
        self.abort_words = [layout.rank_word(r, seg.W_ABORT) for r in range(n) if r != me]
        #: Rank 0's word naming the path of a ``measured`` call.
        self.choice_of_0 = layout.rank_word(0, seg.W_CHOICE)
        self.views = {}
        self.op = ""
        self.deadline = 0.0

    def unbind(self) -> None:
        """Let go of the views over the segment (before it is unmapped)."""
        self.mapping = None
        self.slots = []
        self.views = {}

    def abort(self) -> None:
        """Mark the communicator aborted and tell the peers through the segment, waking
        whoever sleeps on a step word (here or in a peer), so every wait fails now."""
        self.aborted = True
        if self.mapping is None or self.broken is not None:
            return
        try:
            self.words[self.layout.rank_word(self.rank, seg.W_ABORT)] = 1
            futex = self.waiter.futex
            if futex is not None:
                for r in range(self.size):
                    futex.wake(self.control_at + 8 * self.layout.rank_word(r, seg.W_STEP))
        except (ValueError, TypeError, AttributeError):  # released or never bound
            pass

    # -- an operation's start and its failures -----------------------------------------

    def begin(self, what: str, timeout: timedelta | None) -> None:
        """Start operation ``what``: its deadline set, or why it cannot run raised.

        Raises:
            CommOperationError: the communicator was aborted, failed earlier or finalized.
        """
        if self.aborted:
            raise CommOperationError(f"{what}: the shm communicator was aborted; create a new one")
        if self.broken is not None:
            raise CommOperationError(
                f"{what}: the shm communicator failed earlier ({self.broken}); abort it and "
                f"create a new one (or reconfigure)"
            )
        if self.mapping is None:
            raise CommOperationError(f"{what}: the shm communicator was finalized")
        seconds = timeout.total_seconds() if timeout is not None else self.default_s
        self.op = what
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def alarm(self, final: bool) -> None:
        """Raise if this communicator was aborted, a peer aborted or died, or (``final``) the
        deadline passed; otherwise run :attr:`on_alarm` (pending point-to-point progress)."""
        what = self.op
        if self.aborted:
            raise self.fail(CommOperationError(f"{what}: aborted while waiting"))
        w = self.words
        gone = [r for r, i in zip(self.peers, self.abort_words, strict=True) if w[i]]
        if gone and self.waiter.satisfied():
            return  # the peer published what this rank waited for before it went
        if gone:
            raise self.fail(
                CommOperationError(
                    f"{what}: rank(s) {gone} aborted the communicator; abort it here too"
                )
            )
        liveness = self.liveness
        dead = liveness.dead() if liveness is not None else []
        if dead and self.waiter.satisfied():
            return
        if dead:
            raise self.fail(
                CommOperationError(
                    f"{what}: rank(s) {dead} exited (killed or crashed) while this rank waited "
                    f"for them; abort this communicator and create a new one (or reconfigure)"
                )
            )
        if final:
            raise self.fail(seg.timeout_error(what, self.seconds, self.lagging()))
        self.on_alarm()

    def size_mismatch(self, h: int, nbytes: int) -> CommInputError | None:
        """After a one-step all-reduce's step in half ``h``: the error to raise if a peer
        announced another size than ``nbytes`` (every rank finds it after the same step,
        so all of them raise and the communicator stays in step)."""
        w = self.words
        for r, i in zip(self.peers, self.peer_sizes[h], strict=True):
            if w[i] != nbytes:
                return CommInputError(
                    f"{self.op or 'all_reduce'}: rank {r} passed {w[i]} bytes where rank "
                    f"{self.rank} passed {nbytes}; every rank must pass the same size"
                )
        return None

    def lagging(self) -> list[int]:
        """The peers that have not published this rank's current step."""
        w = self.words
        return [r for r, i in zip(self.peers, self.peer_steps, strict=True) if w[i] < self.step]

    def fail(self, exc: Exception) -> Exception:
        """Remember ``exc`` as the reason this communicator is unusable; return it."""
        self.broken = str(exc)
        return exc

    # -- steps --------------------------------------------------------------------------

    def half(self) -> int:
        """The half of the slots the next step stages in (they alternate)."""
        self.use += 1
        return self.use & 1

    def sync(self) -> None:
        """Publish the next step and wait until every peer published it."""
        self.post()
        self.wait_peers()

    def post(self) -> None:
        """Publish the next step (what this rank staged for it is in place)."""
        self.step += 1
        w = self.words
        w[self.my_step] = self.step
        for i in self.sleep_words:
            if w[i]:  # a peer sleeps on some step word: wake whoever sleeps on this one
                self.waiter.futex.wake(self.my_step_at)  # type: ignore[union-attr]
                break

    def set_sleeping(self, on: int) -> None:
        """Announce (``1``) or withdraw (``0``) that this rank sleeps on a step word."""
        self.words[self.my_sleep] = on

    def wait_peers(self) -> None:
        """Wait until every peer published this rank's current step."""
        target = self.step
        w = self.words
        idx = self.peer_steps
        for _ in range(self.fast_polls):
            for i in idx:
                if w[i] < target:
                    break
            else:
                return
        self.waiter.wait(
            lambda: all(w[i] >= target for i in idx), self.deadline, self.alarm, self.sleep_on
        )

    def sleep_on(self) -> tuple[int, int] | None:
        """The first peer step word still behind this rank's step: its address and value."""
        w, target = self.words, self.step
        for i in self.peer_steps:
            seen = w[i]
            if seen < target:
                return self.control_at + 8 * i, seen
        return None
