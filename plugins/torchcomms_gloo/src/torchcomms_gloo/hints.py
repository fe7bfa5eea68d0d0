"""The hints the gloo backend reads, and the engine settings they make.

``lazy`` (the reference's key) connects peers on first use instead of at creation;
``persistent_store`` is accepted as the reference's bridge passes it; ``interface`` and
``hostname`` choose where the engine binds (see ``interface.py``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

from torchcomms_core.hints import bool_hint

LAZY = "lazy"
PERSISTENT_STORE = "persistent_store"

#: Every key the backend reads (``torchcomms backends --json`` lists them).
HINT_KEYS: tuple[str, ...] = ("interface", "hostname", LAZY, PERSISTENT_STORE)

# torch's Gloo engine reads this variable each time one is built.
_LAZY_VARIABLE = "TORCH_GLOO_LAZY_INIT"
_lazy_lock = threading.Lock()


def check(hints: dict[str, str]) -> bool:
    """Validate the boolean hints; return whether to connect lazily.

    ``persistent_store``: the store a communicator is given is always used directly and
    kept for its whole life (split and reconfigure rendezvous through it), which is what
    the reference does with ``true``; ``false`` is accepted and changes nothing.
    """
    bool_hint(hints, PERSISTENT_STORE, True)
    return bool_hint(hints, LAZY, False)


@contextlib.contextmanager
def engine_connects(lazy: bool) -> Iterator[None]:
    """Build the engine inside this block to connect eagerly (default) or lazily.

    The engine reads ``TORCH_GLOO_LAZY_INIT`` when it is built. When the environment
    already says what is asked (the common case: unset, eager), nothing is changed and
    nothing is held, so engines of several communicators can connect to each other from
    threads of one process at once. Otherwise the block sets the variable for the build
    only (under a lock, which the eager build then holds while it connects) and puts
    back what the user had.
    """
    before = os.environ.get(_LAZY_VARIABLE)
    if _truthy(before) == lazy:
        yield
        return
    with _lazy_lock:
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
