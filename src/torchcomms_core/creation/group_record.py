"""What ``torch.distributed`` knows about a group it is creating on torchcomms.

(A leaf of the core: ``new_comm`` reads it; it imports nothing of ours.)

Under ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`` PyTorch 2.13 calls ``new_comm(backend,
device, name=, store=, hints=)`` from ``_new_process_group_helper`` without the rank,
size or timeout the user gave ``init_process_group``. Those are local variables of that
call; reading them from its frame is the one route the switch leaves open that gives
exactly the values plain gloo gets, however the job was launched (``tcp://``,
``env://``, ``store=``). If PyTorch renames the function or its variables, the lookup
finds nothing and ``new_comm`` falls back to the launcher's environment.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import sys
from collections.abc import Iterator
from datetime import timedelta
from types import FrameType
from typing import Any

# How far up from new_comm c10d's helper may be (new_comm -> c10d helper is 1-2 frames;
# allow for a decorator or two in between).
_MAX_DEPTH = 8
_HELPER = "_new_process_group_helper"


@dataclasses.dataclass(frozen=True)
class GroupContext:
    """Rank, size and timeout c10d gives the process group it is creating."""

    rank: int
    size: int
    timeout: timedelta | None
    global_ranks: tuple[int, ...]
    group_desc: str | None
    #: The ``pg_options`` given for the group (what c10d passes a registered backend's
    #: extended-API creator), ``None`` when none were.
    backend_options: Any = None


# What a caller in the core (``torchcomms.distwrap``) states for the communicators it is
# creating, the same facts c10d's helper holds in its frame.
_given: contextvars.ContextVar[GroupContext | None] = contextvars.ContextVar(
    "torchcomms_given_group", default=None
)


@contextlib.contextmanager
def given_group(context: GroupContext) -> Iterator[None]:
    """Within this block, ``new_comm`` calls made with a store use ``context``'s rank, size
    and timeout (as under c10d's own helper) instead of the launcher's environment."""
    token = _given.set(context)
    try:
        yield
    finally:
        _given.reset(token)


def current_group() -> GroupContext | None:
    """The context stated with :func:`given_group` around the current call, if any
    (``new_comm`` states c10d's while a backend builds its engine)."""
    return _given.get()


def _helper_code() -> Any:
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    fn = getattr(c10d, _HELPER, None) if c10d is not None else None
    while fn is not None and hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return getattr(fn, "__code__", None)


def _helper_locals() -> dict[str, Any] | None:
    """The local variables of ``_new_process_group_helper`` when it is among the callers of
    the function that calls this (up to ``_MAX_DEPTH`` frames), else ``None``."""
    code = _helper_code()
    if code is None:
        return None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code is code:
            return frame.f_locals
        frame = frame.f_back
    return None


def creating_group(store: Any) -> GroupContext | None:
    """The context of the c10d group being created with ``store``, if c10d is creating one.

    Only a call made with a store from inside ``_new_process_group_helper`` qualifies;
    anything else (a user's own ``new_comm``) gets ``None``.
    """
    if store is None:
        return None
    given = _given.get()
    if given is not None:
        return given
    local = _helper_locals()
    return _read(local) if local is not None else None


def group_being_created() -> GroupContext | None:
    """The context of the c10d group whose creation is running the caller (stated with
    :func:`given_group`, or read from ``_new_process_group_helper``), else ``None``."""
    given = _given.get()
    if given is not None:
        return given
    local = _helper_locals()
    return _read(local) if local is not None else None


def creating_device() -> str | None:
    """The device type c10d is creating a backend for (``"cpu"``, ``"cuda"``), read from
    ``_new_process_group_helper``'s loop over the group's devices, when the caller runs
    inside it; else ``None``."""
    local = _helper_locals()
    device = local.get("device") if local is not None else None
    return device if isinstance(device, str) and device else None


def _read(local: dict[str, Any]) -> GroupContext | None:
    rank, size = local.get("group_rank"), local.get("group_size")
    if not (isinstance(rank, int) and isinstance(size, int) and 0 <= rank < size):
        return None
    timeout = local.get("timeout")
    if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
        timeout = None
    ranks = local.get("global_ranks_in_group") or ()
    desc = local.get("group_desc")
    return GroupContext(
        rank,
        size,
        timeout,
        tuple(int(r) for r in ranks),
        desc if isinstance(desc, str) else None,
        local.get("backend_options"),
    )
