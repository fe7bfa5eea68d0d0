"""Communicator names: claimed per rank in the store, so a name is never used twice."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from torchcomms_core.foundation.errors import CommInputError

_auto_names = itertools.count()


def check_name(name: Any, where: str) -> str:
    """Accept a non-empty string without '/' (names become store prefixes)."""
    if not isinstance(name, str) or not name or "/" in name:
        raise CommInputError(f"{where}: name must be a non-empty string without '/', got {name!r}")
    return name


def claim_name(store: Any, key: str, rank: int, parent: str | None = None) -> int:
    """Refuse a communicator name this rank's live communicator holds with this store.

    Returns how many times this rank claimed the name (1 the first time): a name given
    back by :func:`release_name` (its communicator was finalized, or could not be
    created) may be claimed again, and the count tells the incarnations apart (every
    rank creates and finalizes its communicators in the same order, so they agree).
    """
    if store.add(f"names/{key}/{rank}", 1) > 1:
        store.add(f"names/{key}/{rank}", -1)
        where = f"split of {parent!r}" if parent else "this job"
        name = key.split("/", 1)[-1]
        raise CommInputError(
            f"a communicator named {name!r} already exists in {where} (rank {rank}); every "
            f"live communicator needs a unique name: pass a different name=, or finalize "
            f"the other one first"
        )
    return int(store.add(f"names/{key}/{rank}/uses", 1))


def release_name(store: Any, key: str, rank: int) -> None:
    """Give back a name whose communicator could not be created or was finalized, so a
    later communicator may take it."""
    try:
        store.add(f"names/{key}/{rank}", -1)
    except Exception:  # the store itself may be what failed; the original error matters
        pass


def auto_name() -> str:
    """``comm_<n>`` in creation order, which matches across ranks only from the main thread."""
    if threading.current_thread() is not threading.main_thread():
        raise CommInputError(
            "new_comm: pass name= when creating a communicator from a thread other than the "
            "main thread; generated names follow creation order, which threads make "
            "different on different ranks"
        )
    return f"comm_{next(_auto_names)}"
