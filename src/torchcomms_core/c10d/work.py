"""``CommWork``: the c10d ``Work`` that ``torch.distributed`` callers get from a wrapped comm.

It settles one or more ``TorchWork`` handles, runs a local post-step once, and hands out
the ``torch.futures.Future`` that DDP and its communication hooks chain on.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from torch._C._distributed_c10d import Work

from torchcomms_core.c10d.daemon import Daemon


class CommWork(Work):
    """A c10d ``Work`` over torchcomms work handles (anything with ``wait``/``is_completed``).

    ``result`` is the value of the future (what c10d's own engines put there: the output
    tensors); ``then`` runs once after every handle completed, on whichever thread settles.
    ``source_rank`` is the peer of a receive (a function when only completion tells, as
    for a receive from any source); ``record`` is the profiler record ended on completion.
    """

    def __init__(
        self,
        works: Sequence[Any],
        result: Any,
        then: Callable[[], None] | None = None,
        source_rank: int | Callable[[], int] = -1,
        record: Any = None,
    ) -> None:
        super().__init__()
        self._works: Sequence[Any] = works
        self._result = result
        self._then = then
        self._src_rank = source_rank
        self._record = record
        # Settling runs completion steps (copy-backs, AVG division) that must run once,
        # while the caller and the future's completion thread may both try.
        self._lock = threading.Lock()
        self._done = False
        self._error: BaseException | None = None
        self._future: torch.futures.Future[Any] | None = None
        self._resolved = False

    # -- c10d Work API ---------------------------------------------------------------

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done; raises the operation's error. Per-op timeouts already apply."""
        if not self._done:
            self._settle()
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        if self._done:
            return True
        # Someone else is settling right now: report "not yet" instead of blocking.
        if not self._lock.acquire(blocking=False):
            return False
        try:
            if not self._done and not all(w.is_completed() for w in self._works):
                return False
        finally:
            self._lock.release()
        self._settle()
        return True

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error

    def get_future(self) -> torch.futures.Future[Any]:
        """A future completed with the output tensors once the operation is done."""
        with self._lock:
            if self._future is None:
                self._future = torch.futures.Future()
                if not self._done:
                    _completer.put(self)
            done = self._done
        if done:
            self._resolve()
        return self._future

    def result(self) -> list[torch.Tensor]:
        return _flat_tensors(self._result)

    def source_rank(self) -> int:
        src = self._src_rank
        if callable(src):
            self.wait()
            return src()
        return src

    def _source_rank(self) -> int:
        return self.source_rank()

    def add_record(self, record: Any) -> None:
        """End ``record`` (a profiler record) when this work completes."""
        with self._lock:
            if not self._done:
                self._record = record
                return
        record.done()

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    # -- settling --------------------------------------------------------------------

    def _settle(self) -> None:
        with self._lock:
            if not self._done:
                try:
                    for work in self._works:
                        work.wait()
                    if self._then is not None:
                        self._then()
                except BaseException as exc:  # kept and re-raised to every waiter
                    self._error = exc
                self._done = True
                self._works = ()
                self._then = None
                record, self._record = self._record, None
                if record is not None:
                    record.done()
            if self._future is None:  # nobody asked for one (get_future takes the lock)
                return
        self._resolve()

    def _resolve(self) -> None:
        with self._lock:
            fut = self._future
            if fut is None or self._resolved or not self._done:
                return
            self._resolved = True
        # Outside the lock: the future runs its callbacks (DDP's .then) inline.
        if self._error is not None:
            fut.set_exception(self._error)
        else:
            fut.set_result(self._result)

    def __repr__(self) -> str:
        state = "done" if self._done else "pending"
        return f"<CommWork {state}{' failed' if self._error is not None else ''}>"


def done_work(result: Any) -> CommWork:
    """A ``CommWork`` that is already complete (nothing to wait for)."""
    return CommWork((), result)


def _flat_tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    out: list[torch.Tensor] = []
    if isinstance(value, (list, tuple)):
        for item in value:
            out.extend(_flat_tensors(item))
    return out


def _settle(work: CommWork) -> None:
    """Settle ``work`` on the completer's thread, which must outlive any one work."""
    try:
        work._settle()  # the operation's own errors are kept on the work and future
    except BaseException as exc:
        sys.stderr.write(f"torchcomms: completing {work!r} failed: {exc!r}\n")


# One daemon thread settles works whose future was requested, in issue order. Futures
# must complete without anyone calling ``wait()`` (DDP only waits on the future), and
# engines differ in how they signal completion, so a thread waits for them.
_completer: Daemon[CommWork] = Daemon("torchcomms-futures", _settle)
