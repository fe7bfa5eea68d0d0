"""The join barrier: every rank of a new communicator arrived, in two store operations.

An engine that connects on first use (gloo's ``lazy`` hint) returns from its creation
without having heard from any peer. ``new_comm`` and ``split`` still promise that every
rank arrived, so the core counts the ranks in: each adds one to a counter, the rank that
brings it to the size sets a flag, the others wait for the flag. Two operations per rank
and two keys of fixed length, whatever the size, where a store read per peer would cost N.

When the flag does not come within the timeout, the message names the missing ranks
where their name claims (one key per rank, written by ``claim_name`` before the engine was
built) can tell: a search that halves the members checks a whole range in one operation,
so finding a few missing ranks among a hundred thousand takes a few dozen checks.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from torchcomms_core.foundation.errors import CommTimeoutError
from torchcomms_core.foundation.work import is_timeout_error

_COUNT = "join/count"
_ALL = "join/all"
#: At most this many missing ranks are looked for and named.
NAMED = 8


def join(
    store: Any,
    size: int,
    timeout: timedelta,
    what: str,
    claim_key: Callable[[int], str] | None = None,
    claims: Any = None,
    members: Sequence[int] | None = None,
) -> None:
    """Return once all ``size`` ranks called ``join`` on ``store``, or raise a timeout.

    ``claims``/``claim_key(r)`` locate the name claim of member ``members[r]`` (the key
    exists once that rank started creating the communicator), used only to explain a
    timeout.
    """
    if store.add(_COUNT, 1) >= size:
        store.set(_ALL, b"1")
        return
    try:
        store.wait([_ALL], timeout)
    except Exception as exc:
        if not is_timeout_error(exc):
            raise
        arrived = _arrived(store)
        try:  # leave the count as it was, so a retry under the same name counts afresh
            store.add(_COUNT, -1)
        except Exception:
            pass
        missing: list[int] = []
        if claims is not None and claim_key is not None:
            ids = list(members) if members is not None else list(range(size))
            missing = [ids[i] for i in missing_keys(claims, [claim_key(r) for r in ids], NAMED)]
        if missing:  # ranks that timed out already took themselves off the count
            more = " and more" if len(missing) >= NAMED else ""
            seen = f"{size - len(missing)} of {size} ranks" if not more else "not all ranks"
            detail = f"only {seen} arrived within {timeout}: ranks {missing}{more} never started"
        else:
            detail = f"only {max(arrived, 0)} of {size} ranks arrived within {timeout}"
        raise CommTimeoutError(
            f"{what}: {detail}; every rank must make the same call with the same name; check "
            f"that all {size} are running and can reach the store"
        ) from exc


def join_or_finalize(
    backend: Any, store: Any, size: int, timeout: timedelta, what: str, **explain: Any
) -> None:
    """:func:`join` for a backend just created; on failure the backend is finalized."""
    try:
        join(store, size, timeout, what, **explain)
    except BaseException:
        try:
            backend.finalize()
        except Exception:  # the join's error is the one to report
            pass
        raise


def members_key(members: Sequence[int]) -> str:
    """A key of fixed length for a member list: its size and a digest of its ranks.

    Names are claimed per rank before a split is created, so two splits of one name
    never share the key; the digest only keeps the members of one split apart from
    another split's of the same name (non-members pass ``[]``: ``none``).
    """
    if not members:
        return "none"
    digest = hashlib.blake2b(",".join(map(str, members)).encode(), digest_size=8)
    return f"{len(members)}x{digest.hexdigest()}"


def _arrived(store: Any) -> int:
    try:
        return int(store.add(_COUNT, 0))
    except Exception:  # the store itself may be what failed
        return -1


def missing_keys(store: Any, keys: list[str], limit: int) -> list[int]:
    """Positions of up to ``limit`` keys of ``keys`` that ``store`` does not hold.

    Halves the list: a range whose keys all exist costs one ``check``, so ``k`` missing
    keys among ``n`` take about ``2 k log2(n)`` checks.
    """
    found: list[int] = []

    def search(lo: int, hi: int) -> None:
        if lo >= hi or len(found) >= limit:
            return
        try:
            if store.check(keys[lo:hi]):
                return
        except Exception:
            return
        if hi - lo == 1:
            found.append(lo)
            return
        mid = (lo + hi) // 2
        search(lo, mid)
        search(mid, hi)

    search(0, len(keys))
    return found
