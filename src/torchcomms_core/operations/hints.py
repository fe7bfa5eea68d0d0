"""Backend hints: reading typed values, and reporting keys no backend reads.

A backend declares the keys it reads in ``hint_keys``; a key it does not list is reported
once per process with a warning naming the key and the keys that exist, never dropped in
silence. Backends read values with :func:`bool_hint` and :func:`int_hint`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable, Sequence

from torchcomms_core.foundation.env import parse_bool
from torchcomms_core.foundation.errors import CommInputError

__all__ = [
    "CORE_HINTS",
    "CORE_HINT_KEYS",
    "UnknownHintWarning",
    "bool_hint",
    "core_hint_keys",
    "int_hint",
    "key_known",
    "warn_unknown_hints",
]

#: Hints the core reads for every backend (#45): the tuner, the tuner's own settings
#: (``tuner.<key>``, in ``TunerContext.hints``), and hints forcing an algorithm.
CORE_HINT_KEYS: tuple[str, ...] = ("tuner", "tuner.*", "algorithm.*")


def core_hint_keys(declared: Sequence[str] | None) -> tuple[str, ...] | None:
    """A backend's declared ``hint_keys`` plus :data:`CORE_HINT_KEYS` (``None`` stays)."""
    return None if declared is None else (*declared, *CORE_HINT_KEYS)


class UnknownHintWarning(UserWarning):
    """A hint was passed that the backend does not read."""


#: Hints every communicator accepts, whatever its backend: ``persistent_store`` (PyTorch's
#: switch and the c10d names pass it: the store given is used directly, which every
#: backend does through the core).
CORE_HINTS: tuple[str, ...] = ("persistent_store",)

_lock = threading.Lock()
# (backend name, key) pairs already reported in this process.
_reported: set[tuple[str, str]] = set()


def key_known(key: str, keys: Iterable[str]) -> bool:
    """Whether ``key`` is one of ``keys`` (an entry ending in ``*`` matches its prefix)."""
    for known in keys:
        if known.endswith("*"):
            if key.startswith(known[:-1]) and len(key) > len(known) - 1:
                return True
        elif key == known:
            return True
    return False


def warn_unknown_hints(backend: str, declared: Sequence[str] | None, hints: dict[str, str]) -> None:
    """Warn once per process for each key of ``hints`` that ``declared`` does not list.

    ``declared=None`` (a backend that does not declare its keys) checks nothing.
    """
    if declared is None:
        return
    for key in hints:
        if key_known(key, declared) or key in CORE_HINTS:
            continue
        with _lock:
            if (backend, key) in _reported:
                continue
            _reported.add((backend, key))
        listing = ", ".join(repr(k) for k in declared) or "none"
        warnings.warn(
            f"hint {key!r} is not read by backend {backend!r} and has no effect; the hints "
            f"it reads are {listing} (`torchcomms backends --json` lists every backend's)",
            UnknownHintWarning,
            stacklevel=3,
        )


def bool_hint(hints: dict[str, str], key: str, default: bool) -> bool:
    """Read a boolean hint (``true``/``false``, ``1``/``0``, ``yes``/``no``, ``on``/``off``)."""
    raw = hints.get(key)
    if raw is None:
        return default
    value = parse_bool(raw)
    if value is None:
        raise CommInputError(f"hint {key}={raw!r} is not a boolean; use 'true' or 'false'")
    return value


def int_hint(hints: dict[str, str], key: str, default: int, *, minimum: int = 0) -> int:
    """Read an integer hint of at least ``minimum``."""
    raw = hints.get(key)
    if raw is None:
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise CommInputError(f"hint {key}={raw!r} is not an integer; pass e.g. '1000'") from None
    if value < minimum:
        raise CommInputError(f"hint {key}={raw!r} must be at least {minimum}")
    return value


def _reset_reported() -> None:
    """Forget which hints were reported (tests)."""
    with _lock:
        _reported.clear()
