"""The hints the gloo backend reads, and the engine settings they make.

``lazy`` (the reference's key) connects peers on first use instead of at creation;
``persistent_store`` is accepted as the reference's bridge passes it; ``interface`` and
``hostname`` choose where the engine binds (see ``interface.py``); ``loop_nice`` sets the
priority of the engine's event-loop thread (see ``loop_priority.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from torchcomms_core.plugin import CommInputError, bool_hint, env_count

LAZY = "lazy"
PERSISTENT_STORE = "persistent_store"

#: Every key the backend reads (``torchcomms backends --json`` lists them).
HINT_KEYS: tuple[str, ...] = ("interface", "hostname", LAZY, PERSISTENT_STORE, "loop_nice")

# torch's Gloo engine reads this variable each time one is built.
_LAZY_VARIABLE = "TORCH_GLOO_LAZY_INIT"


#: Communicators of more ranks than this connect lazily unless told otherwise.
LAZY_ABOVE_DEFAULT = 64
LAZY_ABOVE_VARIABLE = "TORCHCOMM_GLOO_LAZY_ABOVE"


def check(hints: dict[str, str], size: int = 1) -> bool:
    """Validate the boolean hints; return whether a communicator of ``size`` connects lazily.

    ``lazy``, when given, decides. Otherwise torch's ``TORCH_GLOO_LAZY_INIT``, when set,
    decides, and without either a communicator connects its full mesh at creation up to
    ``TORCHCOMM_GLOO_LAZY_ABOVE`` ranks (64) and lazily above: an eager mesh costs every
    rank a store read and a connection per peer, which at a thousand ranks is a million
    store operations and a million sockets before the first collective.

    ``persistent_store``: the store a communicator is given is always used directly and
    kept for its whole life (split and reconfigure rendezvous through it), which is what
    the reference does with ``true``; ``false`` is accepted and changes nothing.
    """
    bool_hint(hints, PERSISTENT_STORE, True)
    if LAZY in hints:
        return bool_hint(hints, LAZY, False)
    variable = os.environ.get(_LAZY_VARIABLE, "").strip()
    if variable:
        return _truthy(variable)
    return size > lazy_above()


def lazy_above() -> int:
    """The size above which communicators connect lazily (``TORCHCOMM_GLOO_LAZY_ABOVE``)."""
    return env_count(
        LAZY_ABOVE_VARIABLE,
        LAZY_ABOVE_DEFAULT,
        lambda raw: CommInputError(
            f"{LAZY_ABOVE_VARIABLE}={raw!r} must be a non-negative integer (the largest "
            f"communicator that connects its peers at creation; 0 makes every one lazy)"
        ),
    )


class _EnvironmentLock:
    """Many engine builds that read the environment at once, or one that changes it.

    A thread that changes a variable while another thread's engine reads the environment
    can crash the process (``setenv`` against ``getenv``), so builds that leave the
    environment alone share this lock and a build that must change it holds it alone.
    A waiting writer does not keep new readers out: an eager build waits for its peers,
    which may be threads of this process that must still get in.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._readers = 0
        self._writer = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._writer:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._readers:
                self._cond.wait()
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


_environment = _EnvironmentLock()


@contextlib.contextmanager
def engine_connects(lazy: bool) -> Iterator[None]:
    """Build the engine inside this block to connect eagerly or lazily.

    The engine reads ``TORCH_GLOO_LAZY_INIT`` when it is built. When the environment
    already says what is asked (the common case), nothing is changed and the build only
    shares a lock with other such builds, so engines of several communicators can connect
    to each other from threads of one process at once. Otherwise the block sets the
    variable for the build alone and puts back what the user had. (An eager build that
    must change the variable holds the lock while it connects: its peers cannot be
    threads of the same process.)
    """
    with _environment.shared():
        if _truthy(os.environ.get(_LAZY_VARIABLE)) == lazy:
            yield
            return
    with _environment.exclusive():
        before = os.environ.get(_LAZY_VARIABLE)
        os.environ[_LAZY_VARIABLE] = "1" if lazy else "0"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(_LAZY_VARIABLE, None)
            else:
                os.environ[_LAZY_VARIABLE] = before


def _truthy(value: str | None) -> bool:
    """How torch reads a boolean variable (unset: false)."""
    return value is not None and value.strip().lower() in ("1", "true", "yes", "y", "on")
