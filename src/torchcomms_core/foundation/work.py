"""``TorchWork``: the handle every operation returns.

It wraps whatever the backend returned (``None`` when done, else an object with
``wait()``), runs the core's completion steps, and records status and error.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchcomms_core.foundation import errors

if TYPE_CHECKING:
    from torchcomms_core.foundation.protocols import Communicator as TorchComm  # any communicator


class WorkStatus(enum.Enum):
    """The state of a ``TorchWork``, as its ``status`` and ``get_status()`` report it.

    The state moves on when ``wait()``, ``wait_blocking()`` or ``is_completed()`` sees the
    operation end; reading it does not ask the engine.
    """

    #: Created for an operation whose pre-hooks run before the backend is called.
    NOT_STARTED = 0
    #: Issued to the backend and not seen finished yet.
    INPROGRESS = 1
    #: Finished successfully, its results (copy-backs included) in place.
    COMPLETED = 2
    #: Did not finish within its timeout; ``error`` holds the ``CommTimeoutError`` that
    #: ``wait()`` raises.
    TIMEDOUT = 3
    #: Failed (the engine failed, a copy-back step failed, or the communicator was aborted
    #: while it was in flight); ``error`` holds the exception ``wait()`` raises.
    ERROR = 4


_COMPLETED = WorkStatus.COMPLETED
_new = object.__new__

_TIMEOUT_MARKERS = ("timed out", "timeout", "deadline")


def is_timeout_error(exc: BaseException) -> bool:
    """Tell whether an engine exception reports an expired timeout.

    Engines (c10d, gloo) report timeouts as ``RuntimeError`` subclasses whose text says
    so; only those are read. A ``TypeError`` that merely mentions "timeout" is not one.
    """
    if isinstance(exc, TimeoutError):
        return True
    if not isinstance(exc, RuntimeError) or isinstance(
        exc, (NotImplementedError, errors.TorchCommError)
    ):
        return False
    text = str(exc).lower()
    return any(marker in text for marker in _TIMEOUT_MARKERS)


def engine_start_error(
    what: str, timeout: Any, exc: BaseException, advice: str
) -> errors.TorchCommError:
    """The error for an engine that could not start (``what`` says which, for whom).

    A ``CommTimeoutError`` ``"{what} within {timeout}: {exc}{advice}"`` when ``exc`` reports
    an expired timeout, else a ``CommOperationError``; ``exc`` is its cause.
    """
    if is_timeout_error(exc):
        error: errors.TorchCommError = errors.CommTimeoutError(
            f"{what} within {timeout}: {exc}{advice}"
        )
    else:
        error = errors.CommOperationError(f"{what}: {exc}")
    error.__cause__ = exc
    return error


def is_engine_failure(exc: BaseException) -> bool:
    """Tell whether ``exc`` means the engine failed while running an operation.

    Only such errors mark a communicator failed. Argument errors (``TypeError``,
    ``ValueError``, our own input and state errors) leave it healthy: nothing ran.
    """
    if isinstance(exc, (errors.CommInputError, errors.CommTypeError, errors.CommStateError)):
        return False
    if isinstance(exc, (errors.TorchCommError, TimeoutError, ConnectionError)):
        return True
    return isinstance(exc, RuntimeError) and not isinstance(exc, NotImplementedError)


#: Per backend class: the source files and folders whose frames mean "the engine".
_engine_paths: dict[type, tuple[str, ...]] = {}


def _engine_sources(cls: type) -> tuple[str, ...]:
    paths = _engine_paths.get(cls)
    if paths is not None:
        return paths
    import torch.distributed

    found = {os.path.dirname(torch.distributed.__file__) + os.sep}
    for klass in cls.__mro__:
        name = klass.__module__
        if name in ("builtins", "abc", "torchcomms_core.spec") or name.startswith(
            "torchcomms_core.spec."
        ):
            continue  # the spec's defaults run the backend's own methods
        module = sys.modules.get(klass.__module__)
        if klass.__module__.startswith("torchcomms_core."):
            # A base class the core ships (C10dBackend): its own module only.
            where = getattr(module, "__file__", None)
        else:
            top = sys.modules.get(klass.__module__.split(".", 1)[0])
            where = getattr(top, "__file__", None)
            if where and hasattr(top, "__path__"):  # a package: all of it
                where = os.path.dirname(where) + os.sep
        if not where:
            # Defined where no file says so (an interactive session): every frame could
            # be the backend's, so nothing is taken for a plugin's own error.
            _engine_paths[cls] = ("",)
            return ("",)
        found.add(str(where))
    paths = _engine_paths[cls] = tuple(found)
    return paths


def raised_by_plugin_code(exc: BaseException, backend: Any) -> bool:
    """Tell whether ``exc`` came from a plugin's own Python code rather than the engine.

    True when neither ``exc`` nor its causes passed through the backend's code (its
    classes' packages, the core engine module it builds on) or ``torch.distributed``: a
    collective plugin's ``validate``, portable implementation or ``then`` step raised on
    its own. Such an error is the caller's to see, with its traceback; it does not mark
    the communicator failed nor abort the process. Explicit engine signals
    (``TorchCommError``, ``TimeoutError``, ``ConnectionError``) never count as such.
    """
    if backend is None:
        return False
    sources = _engine_sources(type(backend))
    seen: set[int] = set()
    err: BaseException | None = exc
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (errors.TorchCommError, TimeoutError, ConnectionError)):
            return False
        tb = err.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.startswith(sources):
                return False
            tb = tb.tb_next
        err = err.__cause__ or err.__context__
    return True


def _no_blocking_wait(backend: str) -> RuntimeError:
    return RuntimeError(
        f"waitBlocking not implemented for backend {backend}: its wait() already blocks the "
        f"host until the operation is done; call wait()"
    )


class TorchWork:
    """Handle of an issued operation: ``wait()``, ``is_completed()``, ``status``, ``error``."""

    __slots__ = (
        "_inner",
        "_status",
        "_error",
        "_finishers",
        "_comm",
        "_op",
        "_lock",
        "__weakref__",
    )

    def __init__(
        self,
        inner: Any = None,
        finishers: list[Callable[[], object]] | None = None,
        comm: TorchComm | None = None,
        op: str = "",
    ) -> None:
        self._inner = inner
        self._finishers = finishers
        self._comm = comm
        self._op = op
        self._error: BaseException | None = None
        self._lock: threading.Lock | None = None
        if inner is None and not finishers:
            self._status = WorkStatus.COMPLETED
        else:
            self._status = WorkStatus.INPROGRESS
            # Serialises wait() from several threads: the completion steps run once.
            self._lock = threading.Lock()

    @classmethod
    def failed(cls, exc: BaseException, comm: TorchComm | None = None, op: str = "") -> TorchWork:
        """A work that failed with ``exc`` (classified as timeout or error)."""
        work = cls(None, None, comm, op)
        work._status = WorkStatus.INPROGRESS
        work._fail(exc)
        return work

    @classmethod
    def completed(cls, comm: TorchComm | None, op: str) -> TorchWork:
        """A work for an operation the backend finished while it was issued."""
        work = _new(cls)
        work._inner = work._finishers = work._error = work._lock = None
        work._comm, work._op, work._status = comm, op, _COMPLETED
        return work

    @classmethod
    def not_started(cls, comm: TorchComm | None = None, op: str = "") -> TorchWork:
        """A work for an operation whose pre-hooks run before the backend is called."""
        work = cls(None, None, comm, op)
        work._status = WorkStatus.NOT_STARTED
        return work

    def _start(self, inner: Any, finishers: list[Callable[[], object]] | None) -> None:
        """Bind a ``not_started`` work to what the backend returned."""
        self._inner = inner
        self._finishers = finishers
        if inner is None and not finishers:
            self._status = WorkStatus.COMPLETED
        else:
            self._lock = threading.Lock()
            self._status = WorkStatus.INPROGRESS

    def _set_status(self, status: WorkStatus) -> None:
        """Set the status by hand, as the reference allows for Python-backend works."""
        if not isinstance(status, WorkStatus):
            raise errors.CommTypeError(f"_set_status: status must be a WorkStatus, got {status!r}")
        self._status = status
        if status is WorkStatus.COMPLETED:
            self._inner = None
            self._finishers = None

    @property
    def status(self) -> WorkStatus:
        """The work's current :class:`WorkStatus` (the reference's attribute spelling)."""
        return self._status

    @property
    def error(self) -> BaseException | None:
        """The exception that ended this work, or ``None``."""
        return self._error

    def get_status(self) -> WorkStatus:
        """The work's current :class:`WorkStatus` (the reference's method spelling of
        :attr:`status`)."""
        return self._status

    def wait(self) -> bool:
        """Block until the operation is done on the host (CPU) or queued (GPU streams).

        Safe to call from several threads; each returns once the result is in place.

        Raises:
            errors.CommTimeoutError: the operation did not complete within its timeout.
            errors.CommOperationError: the engine failed (a peer died, a connection broke).
            errors.CommStateError: the communicator was aborted while the operation was in flight.
        """
        if self._status is WorkStatus.COMPLETED:
            return True
        lock = self._lock
        if lock is None:  # failed at issue time, or never issued
            if self._error is None:
                raise errors.CommStateError(
                    f"{self._op}: this work was never issued; nothing to wait for"
                )
            raise self._error
        with lock:
            # Re-read under the lock: another thread may have finished the work meanwhile.
            status: WorkStatus = self._status
            if status is WorkStatus.COMPLETED:
                return True
            if status is not WorkStatus.INPROGRESS:
                raise self._error  # type: ignore[misc]
            comm = self._comm
            if comm is not None and comm.is_aborted() and not self._engine_done():
                self._fail(self._aborted_error())
                raise self._error  # type: ignore[misc]
            inner = self._inner
            try:
                if inner is not None:
                    inner.wait()
            except Exception as exc:  # classified, recorded and re-raised
                self._fail(exc)
                if self._error is exc:
                    raise
                raise self._error from exc  # type: ignore[misc]
            self._finish()
        return True

    def _engine_done(self) -> bool:
        probe = getattr(self._inner, "is_completed", None)
        try:
            return self._inner is None or (probe is not None and bool(probe()))
        except Exception:  # an aborted engine may refuse to answer
            return False

    def _aborted_error(self) -> errors.CommStateError:
        name = self._comm.get_name() if self._comm is not None else "?"
        return errors.CommStateError(
            f"{self._op} on communicator {name!r} was abandoned: the communicator was aborted "
            f"while the operation was in flight; its result is undefined. Create a new "
            f"communicator to continue"
        )

    def wait_blocking(self) -> bool:
        """Block the calling host thread until the operation has completed.

        Only backends whose ``wait()`` merely orders streams have it (GPU engines, with
        ``supports_wait_blocking``); their work objects synchronise the host. On the others
        ``wait()`` already blocks the host, and, as in the reference, this raises.

        Raises:
            RuntimeError: the communicator's backend has no host-blocking wait; call
                ``wait()``.
        """
        comm = self._comm
        backend_of = getattr(comm, "get_backend_impl", None)  # None: a work built by hand
        if comm is not None and backend_of is not None:
            if not getattr(backend_of(), "supports_wait_blocking", False):
                raise _no_blocking_wait(repr(comm.get_backend()))
        inner = self._inner
        blocking = getattr(inner, "wait_blocking", None)
        if blocking is None or self._status is not WorkStatus.INPROGRESS:
            return self.wait()
        try:
            blocking()
        except Exception as exc:  # same classification as wait()
            self._fail(exc)
            if self._error is exc:
                raise
            raise self._error from exc  # type: ignore[misc]
        return self.wait()

    def is_completed(self) -> bool:
        """Return ``True`` once the operation has finished (completion steps included)."""
        status = self._status
        if status is WorkStatus.COMPLETED:
            return True
        if status is not WorkStatus.INPROGRESS:
            return True
        inner = self._inner
        if inner is not None:
            # A backend's work without is_completed() cannot say it is done: not until
            # wait() (as the reference answers, and as MultiWork counts it).
            probe = getattr(inner, "is_completed", None)
            if probe is None or not probe():
                return False
        # The engine is done: run the completion steps now, so the result is readable.
        try:
            self.wait()
        except errors.TorchCommError:
            pass
        return True

    def _finish(self) -> None:
        # The engine is done. Copy-back steps are the core's own work: if one fails the
        # work ends in ERROR, but the communicator stays healthy.
        finishers = self._finishers
        self._finishers = None
        self._inner = None
        if finishers:
            try:
                for step in finishers:
                    step()
            except Exception as exc:
                self._status = WorkStatus.ERROR
                self._error = exc
                raise
        self._status = WorkStatus.COMPLETED

    def _fail(self, exc: BaseException) -> None:
        comm = self._comm
        comm_name = comm.get_name() if comm is not None else "?"
        engine = is_engine_failure(exc) and not (
            comm is not None
            and raised_by_plugin_code(exc, getattr(comm, "get_backend_impl", lambda: None)())
        )
        if (
            comm is not None
            and engine
            and comm.is_aborted()
            and not isinstance(exc, errors.CommStateError)
        ):
            err: BaseException = self._aborted_error()
            self._status = WorkStatus.ERROR
        elif isinstance(exc, errors.CommTimeoutError):
            self._status, err = WorkStatus.TIMEDOUT, exc
        elif isinstance(exc, errors.TorchCommError) or not engine:
            self._status, err = WorkStatus.ERROR, exc
        elif is_timeout_error(exc):
            self._status = WorkStatus.TIMEDOUT
            err = errors.CommTimeoutError(
                f"{self._op} on communicator {comm_name!r} timed out: {exc}. "
                f"A peer may have died, hung, or called a different operation; raise the "
                f"timeout with timeout=... or TORCHCOMM_TIMEOUT_SECONDS if it is just slow"
            )
        else:
            self._status = WorkStatus.ERROR
            err = errors.CommOperationError(
                f"{self._op} on communicator {comm_name!r} failed: {exc}"
            )
        if err is not exc:
            err.__cause__ = exc
        self._error = err
        self._inner = None
        self._finishers = None
        if engine and not isinstance(err, errors.CommStateError):
            # The communicator marks itself failed; a work built by hand for another
            # object (or none) has no one to tell.
            tell = getattr(comm, "on_work_failure", None)
            if tell is not None:
                tell(self, err)

    def __repr__(self) -> str:
        return f"<TorchWork {self._op} {self._status.name}>"


class HostWaitedWork(TorchWork):
    """A completed work, named by no communicator, of a backend whose ``wait()`` blocks the
    host (the lean lane's shared works): ``wait_blocking()`` raises as
    :meth:`TorchWork.wait_blocking` does for such backends."""

    __slots__ = ()

    def wait_blocking(self) -> bool:
        """Refuse, as the reference's backends without a host-blocking wait do.

        Raises:
            RuntimeError: always; the operation is done, and ``wait()`` returns at once.
        """
        raise _no_blocking_wait("of this communicator")
