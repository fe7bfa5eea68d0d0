"""Completion of nonblocking MPI operations within their timeouts.

MPI has no timeouts, so every operation is issued nonblocking and completed here: the
requests are polled (``MPI_Test*`` also drives MPI's progress) until they finish or the
operation's deadline passes; then receives are cancelled and :class:`CommTimeoutError`
is raised, and the core marks the communicator failed (and aborts the process if asked).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from torchcomms_core.plugin import CommTimeoutError

_testall = MPI.Request.Testall
_monotonic = time.monotonic
#: Polls between two looks at the clock (and a yield of the GIL to other threads).
_BATCH = 64
#: Seconds of polling flat out; after that, a short nap between polls spares the CPU
#: for a peer that is late rather than slow.
_BUSY_S = 2.0
_NAP_S = 0.0002


def complete(reqs: list[Any], seconds: float, what: str, statuses: list[Any] | None = None) -> None:
    """Poll ``reqs`` until all finished; raise :class:`CommTimeoutError` after ``seconds``.
    ``statuses``: one ``MPI.Status`` per request, filled once they finish."""
    if _testall(reqs, statuses):
        return
    start = _monotonic()
    busy_until, deadline = start + _BUSY_S, start + seconds
    while True:
        for _ in range(_BATCH):
            if _testall(reqs, statuses):
                return
        now = _monotonic()
        if now > deadline:
            raise CommTimeoutError(
                f"{what} did not complete within {seconds:g} s (timed out); a peer may have "
                f"died, hung or issued a different operation"
            )
        if now > busy_until:
            time.sleep(_NAP_S)
        else:
            os.sched_yield()  # let peers run on a machine with more ranks than cores


class MpiWork:
    """Requests of one operation; ``wait()`` completes them within the operation's timeout."""

    __slots__ = ("_reqs", "_seconds", "_what", "_keep", "_owner", "_then", "_done", "_statuses")

    def __init__(
        self,
        reqs: list[Any],
        seconds: float,
        what: str,
        keep: Any,
        owner: set[MpiWork],
        then: Callable[[], None] | None = None,
    ) -> None:
        self._reqs = reqs
        self._seconds = seconds
        self._what = what
        self._keep = keep  # buffers MPI reads or writes until completion
        self._owner = owner
        self._then = then
        self._done = False
        #: ``MPI.Status`` objects the requests fill on completion (``None``: not kept).
        self._statuses: list[Any] | None = None
        owner.add(self)

    def is_completed(self) -> bool:
        if not self._done and _testall(self._reqs, self._statuses):
            self._complete()
        return self._done

    def wait(self) -> bool:
        if self._done:
            return True
        try:
            complete(self._reqs, self._seconds, self._what, self._statuses)
        except CommTimeoutError:
            self.cancel()
            raise
        self._complete()
        return True

    def _complete(self) -> None:
        self._done = True
        self._owner.discard(self)
        self._keep = None
        then = self._then
        if then is not None:
            self._then = None
            then()

    def cancel(self) -> None:
        """Abandon the operation: receives are cancelled; collectives cannot be, and stay
        with the engine until the communicator is freed."""
        if self._done:
            return
        self._done = True
        self._owner.discard(self)
        for req in self._reqs:
            if req == MPI.REQUEST_NULL:
                continue
            try:
                req.Cancel()
            except MPI.Exception:  # already complete, or not cancellable: nothing to undo
                pass


class AnySourceWork(MpiWork):
    """A receive from any source (``MPI_ANY_SOURCE``): ``source_rank()`` names the sender
    once the receive completed."""

    __slots__ = ()

    def __init__(self, req: Any, seconds: float, keep: Any, owner: set[MpiWork]) -> None:
        super().__init__([req], seconds, "recv", keep, owner)
        self._statuses = [MPI.Status()]

    def source_rank(self) -> int:
        if not self._done or self._statuses is None:
            raise RuntimeError(
                "recv from any source: the sender is known only once the receive completed; "
                "call wait() first"
            )
        return int(self._statuses[0].Get_source())
