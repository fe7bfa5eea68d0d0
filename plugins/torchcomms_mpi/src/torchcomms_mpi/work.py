"""Completion of nonblocking MPI operations, and the watchdog that bounds blocking ones.

MPI has no timeouts. An asynchronous operation's ``wait()`` polls its requests until
they finish or its deadline passes, then cancels what it can and raises a timeout, so
the core marks the communicator failed. A blocking call cannot be interrupted: the
watchdog reports it and aborts the MPI job once its deadline has passed.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from mpi4py import MPI

from torchcomms_core import CommTimeoutError

_testall = MPI.Request.Testall
_monotonic = time.monotonic
#: Tests of the requests before ``wait()`` starts sleeping between polls.
_SPIN = 2000
#: Longest sleep between two polls once spinning gave up (seconds).
_MAX_NAP = 0.001


class MpiWork:
    """Requests of one operation; ``wait()`` completes them within the operation's timeout."""

    __slots__ = ("_reqs", "_deadline", "_seconds", "_what", "_keep", "_owner", "_then", "_done")

    def __init__(self, reqs: list[Any], seconds: float, what: str, keep: Any,
                 owner: set[MpiWork], then: Callable[[], None] | None = None) -> None:
        self._reqs = reqs
        self._seconds = seconds
        self._deadline = _monotonic() + seconds
        self._what = what
        self._keep = keep  # buffers MPI reads or writes until completion
        self._owner = owner
        self._then = then
        self._done = False
        owner.add(self)

    def is_completed(self) -> bool:
        if not self._done and _testall(self._reqs):
            self._complete()
        return self._done

    def wait(self) -> bool:
        if self._done:
            return True
        reqs = self._reqs
        for _ in range(_SPIN):
            if _testall(reqs):
                self._complete()
                return True
        nap = 1e-5
        while not _testall(reqs):
            if _monotonic() > self._deadline:
                self.cancel()
                raise CommTimeoutError(
                    f"{self._what} did not complete within {self._seconds:g} s (timed out); a "
                    f"peer may have died, hung or issued a different operation"
                )
            time.sleep(nap)
            nap = min(nap * 2, _MAX_NAP)
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
        """Abandon the operation: cancel receives, free the rest (they finish in the engine)."""
        if self._done:
            return
        self._done = True
        self._owner.discard(self)
        for req in self._reqs:
            if req == MPI.REQUEST_NULL:
                continue
            try:
                req.Cancel()
                if req.Test():
                    continue
                req.Free()
            except MPI.Exception:  # already complete, or the engine refused: nothing to undo
                pass


class Watchdog:
    """Bounds the blocking MPI calls of one communicator by their timeouts.

    Around a blocking call the backend sets ``seconds``, bumps ``seq`` and sets ``what``,
    then clears ``what``: a few attribute writes, no clock read. A daemon thread samples
    them a few times a second; a call still running ``seconds`` after it was first seen is
    reported, and the watchdog calls ``MPI_Abort`` on the communicator, which ends every
    process of the job (MPI cannot cancel a blocking operation in flight).
    """

    #: Seconds between two samples; a timeout fires at most this late.
    PERIOD = 0.2

    def __init__(self, comm: Any, comm_name: str, rank: int) -> None:
        self._comm = comm
        self._name = comm_name
        self._rank = rank
        self.what: str | None = None
        self.seq = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"torchcomms-mpi-watchdog-"
                                        f"{comm_name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        seen, since = -1, 0.0
        while not self._stop.wait(self.PERIOD):
            what, seq = self.what, self.seq
            if what is None:
                seen = -1
            elif seq != seen:
                seen, since = seq, _monotonic() - self.PERIOD / 2
            elif _monotonic() - since > self.seconds and self.seq == seq and self.what:
                self._fire(what)
                return

    def _fire(self, what: str) -> None:
        sys.stderr.write(
            f"torchcomms mpi: rank {self._rank}: {what} on communicator {self._name!r} did not "
            f"complete within its timeout of {self.seconds:g} s (timed out). MPI cannot cancel a "
            f"blocking operation, so the watchdog aborts the MPI job. A peer may have died, hung "
            f"or issued a different operation; raise the timeout with timeout=... or "
            f"TORCHCOMM_TIMEOUT_SECONDS if it is just slow\n"
        )
        sys.stderr.flush()
        try:
            self._comm.Abort(1)
        finally:
            os._exit(1)
