"""Fault tolerance: bind a communicator to a new membership after a rank dies or joins.

``new_comm(..., enable_reconfigure=True)`` returns a communicator that is not bound to a
group yet. Each process publishes ``comm.get_init_handle()`` out of band (see
``_rendezvous`` for the handle's form); ``comm.reconfigure(uuid, init_handles)`` then binds
it to exactly those members: rank = position in the list (sorted order for a set), size =
its length. Members meet in the store given to ``new_comm`` or, without one, in the store
that the member of the first handle hosts.

The orchestration lives here so a backend only implements ``reconfigure_engine``:

1. Arguments are checked (a uuid not used before by this communicator, distinct string
   handles including this process's own).
2. The previous engine is retired with the backend's ``abort`` (never waits for a dead peer).
3. Membership check through the rendezvous store, at a constant number of store
   operations per member (see :func:`_meet`). An attempt's keys live in its own space,
   ``reconfigure/<uuid>/<digest>/`` (the digest of its handle list): handles are unique per
   communicator, so a later communicator that reuses a uuid in the same store never meets
   the earlier one's keys. Each member writes a short arrival record
   ``reconfigure/<uuid>/member/<handle>`` and counts itself in its space; the member that
   completes the count writes the space's ``outcome`` and the others wait for that one
   key. The first member of each list registers it under the uuid; a registered list that
   shares a member with another one is a disagreement.
   ``reconfigure/handle/<handle>`` says which uuid a handle last reconfigured with, in what
   state (a store counter orders attempts). A member whose handle list differs, or who is
   reconfiguring with another uuid over the same members at the same time, makes every
   member raise :class:`CommInputError` at once; a member who gives up (its own attempt
   failed) makes the others fail at once too; a member who never arrives makes the call
   raise :class:`CommTimeoutError` after ``timeout``, naming it.
4. ``backend.reconfigure_engine(store, rank, size, timeout, options)`` builds the new
   engine over ``engine/`` of the attempt's space; splits and windows of the new group
   work under its ``group/``.

On failure the communicator stays unbound (operations raise ``CommStateError``) and a new
``reconfigure`` with a new uuid may be tried.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import Counter
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from torchcomms_core.creation.bootstrap import check_open_files
from torchcomms_core.creation.join import missing_keys
from torchcomms_core.creation.rendezvous import (
    Handle,
    connect,
    has_exited,
    launcher_rank,
    new_token,
    parse_handle,
)
from torchcomms_core.creation.signing import sign_like
from torchcomms_core.foundation import errors
from torchcomms_core.foundation.records import read_record
from torchcomms_core.foundation.states import ABORTED, OK, UNBOUND
from torchcomms_core.foundation.work import TorchWork, engine_start_error, is_timeout_error
from torchcomms_core.operations.validation import check_hints, check_timeout
from torchcomms_core.spec import TorchCommBackend, method_support

if TYPE_CHECKING:
    from torchcomms_core.comm.base import CommBase as TorchComm  # any communicator

_PREFIX = "reconfigure"


def supports_reconfigure(cls: type[TorchCommBackend]) -> bool:
    """Whether a backend class can reconfigure here (``reconfigure_support()``)."""
    return method_support(cls).get("reconfigure_engine") == "native"


def reconfigure_backends() -> list[str]:
    """Names of the installed backends that can reconfigure here (for error messages)."""
    from torchcomms_core.plugin_host.backends import available_backends, get_backend_class

    found = []
    for name in available_backends():
        try:
            cls = get_backend_class(name)
        except Exception:  # a plugin that fails to load is reported where it is used
            continue
        if supports_reconfigure(cls):
            found.append(name)
    return found


def refusal(backend: str, cls: type[TorchCommBackend], where: str) -> str:
    """Why ``backend`` cannot reconfigure, and which installed backends can."""
    _ok, reason = cls.reconfigure_support()
    others = [b for b in reconfigure_backends() if b != backend]
    which = (
        f"use a backend that supports it: {', '.join(repr(b) for b in others)}"
        if others
        else "no installed backend supports it here (torchcomms-gloo does: pip install "
        "torchcomms-gloo)"
    )
    return (
        f"{where}: backend {backend!r} cannot reconfigure (reconfigure not implemented: "
        f"{reason}); pass enable_reconfigure=False, or {which}"
    )


def make_handle(backend: str, rendezvous: tuple[str, int] | None) -> str:
    """A new init handle: ``backend:rank:token`` plus ``:host:port`` of a hosted rendezvous."""
    if rendezvous is None:
        return str(Handle(backend, launcher_rank(), new_token()))
    host, port = rendezvous
    return str(Handle(backend, launcher_rank(), new_token(), host, port))


def _uuid_key(uuid: Any) -> str:
    if isinstance(uuid, bool) or not isinstance(uuid, (int, str)):
        raise errors.CommTypeError(
            f"reconfigure: uuid must be an int or a str, got {type(uuid).__name__}"
        )
    key = str(uuid)
    if not key or "/" in key:
        raise errors.CommInputError(
            f"reconfigure: uuid must be non-empty and contain no '/', got {uuid!r}"
        )
    return key


def _handle_list(init_handles: Any, mine: str, backend: str, hosted: bool) -> list[str]:
    if isinstance(init_handles, (set, frozenset)):
        handles = sorted(init_handles)
    elif isinstance(init_handles, (list, tuple)):
        handles = list(init_handles)
    else:
        raise errors.CommTypeError(
            f"reconfigure: init_handles must be a list (rank = position) or a "
            f"set (sorted order) of handles, got {type(init_handles).__name__}"
        )
    for i, h in enumerate(handles):
        if not isinstance(h, str) or not h:
            raise errors.CommTypeError(
                f"reconfigure: init_handles[{i}] must be a handle string from "
                f"get_init_handle(), got {h!r}"
            )
        parse_handle(h, backend, hosted, f"reconfigure: init_handles[{i}]")
    if len(set(handles)) != len(handles):
        dupes = sorted(h for h, k in Counter(handles).items() if k > 1)
        raise errors.CommInputError(
            f"reconfigure: init_handles lists {dupes} more than once; list each member once"
        )
    if mine not in handles:
        raise errors.CommInputError(
            f"reconfigure: init_handles does not contain this communicator's own handle "
            f"{mine!r}; every member passes the same list, including itself"
        )
    return handles


def _digest(handles: list[str]) -> str:
    return hashlib.sha256("\n".join(handles).encode()).hexdigest()[:16]


def _short(handles: list[str]) -> str:
    shown = [_brief(h) for h in handles[:6]]
    more = f" and {len(handles) - 6} more" if len(handles) > 6 else ""
    return "[" + ", ".join(shown) + "]" + more


def _brief(handle: str) -> str:
    """A handle shortened for messages: its token's last 8 digits and its address."""
    parts = handle.split(":", 3)
    if len(parts) < 3:
        return handle
    return f"{parts[2][-8:]}" + (f"@{parts[3]}" if len(parts) == 4 else "")


def _retire(comm: TorchComm, prev_state: str) -> None:
    """Drop the old engine without waiting for dead peers."""
    if prev_state == UNBOUND or prev_state == ABORTED:
        return  # no engine, or abort() already tore it down
    backend = comm.get_backend_impl()
    try:
        if comm.is_abort_supported():
            backend.abort()
        elif prev_state == OK:
            backend.finalize()  # healthy group: a clean release does not wait on anyone
    except Exception:  # the old engine is gone either way; the new one is what matters
        pass


def _announce(
    store: Any,
    handle: str,
    key: str,
    state: str,
    seq: int,
    against: str = "",
    error: BaseException | None = None,
) -> None:
    entry = {"uuid": key, "state": state, "seq": seq, "against": against}
    if error is not None:  # why this member gave up, for the members still waiting
        entry["kind"] = "input" if isinstance(error, errors.CommInputError) else "other"
        entry["error"] = str(error)[:600]
    store.set(f"{_PREFIX}/handle/{handle}", json.dumps(entry))


#: The fields of the records members publish, and their types (read_record checks them).
_MEMBER: dict[str, type | tuple[type, ...]] = {"rank": int, "digest": str}
_LIST: dict[str, type | tuple[type, ...]] = {"rank": int, "handles": list}
_OUTCOME: dict[str, type | tuple[type, ...]] = {"kind": str}
_ANNOUNCEMENT: dict[str, type | tuple[type, ...]] = {
    "uuid": str,
    "state": str,
    "seq": int,
    "against": str,
}


def _conflicts(ann: dict[str, Any], key: str, seq: int, used: set[str]) -> bool:
    """Whether a peer's announcement shows it reconfiguring with another uuid right now."""
    if ann["uuid"] == key or ann["uuid"] in used:
        return False  # the same attempt, or an older one this rank took part in
    if ann["state"] == "pending" or ann["seq"] > seq:
        return True  # waiting elsewhere now, or started elsewhere after this attempt began
    return bool(ann["state"] == "mismatch" and ann["against"] == key)


def _includes(store: Any, ann: dict[str, Any], peer: str, mine: str) -> bool:
    """Whether the peer's other attempt lists this rank (else it is not a conflict: the peer
    rebinds a group without this rank first, and comes to this uuid afterwards)."""
    if ann["state"] == "mismatch":
        return True  # the peer already saw this uuid as the conflict
    theirs_key = f"{_PREFIX}/{ann['uuid']}/member/{peer}"
    if not store.check([theirs_key]):
        return False  # not published yet: look again at the next scan
    digest = read_record(store.get(theirs_key), theirs_key, _MEMBER)["digest"]
    list_key = f"{_space(ann['uuid'], digest)}/list"
    if not store.check([list_key]):
        return True  # its list is being published: a member of it, most likely
    return mine in read_record(store.get(list_key), list_key, _LIST)["handles"]


class _GroupError:
    """Marks an error whose message speaks for the whole group (a mismatch, a timeout):
    the members still waiting raise it as it is, not as "member r gave up"."""


class _Disagreement(errors.CommInputError, _GroupError):
    pass


class _Absent(errors.CommTimeoutError, _GroupError):
    pass


class _UuidMismatch(errors.CommInputError, _GroupError):
    def __init__(self, message: str, other: str) -> None:
        super().__init__(message)
        self.other = other


#: How many absent members a scan looks at (conflicts, exits) and a timeout names.
_SCANNED = 64
_NAMED = 6
_OK = json.dumps({"kind": "ok"})


def _space(key: str, digest: str) -> str:
    """The keys of one attempt: a uuid and one handle list. Handles are unique per
    communicator, so a later communicator that reuses a uuid (in the same store) starts in
    a space of its own and never meets the earlier one's counters, outcome or engine keys."""
    return f"{_PREFIX}/{key}/{digest}"


def _meet(
    comm: TorchComm,
    store: Any,
    key: str,
    rank: int,
    handles: list[str],
    timeout: timedelta,
    seq: int,
) -> None:
    """Return once every member arrived under ``key`` with the same handle list.

    A constant number of store operations per member, whatever the size: each member
    writes a short arrival record and adds one to the counter of its attempt's space
    (:func:`_space`: the uuid and the digest of its list). The member whose count reaches
    the size has seen the whole group agree and says so in the space's outcome key; the
    others wait for that key. The first member of each list publishes it and registers its
    digest under the uuid, then reads the lists registered before: one that shares a member
    with its own is a disagreement (both spaces' outcomes say so, so every member waiting
    learns it at once); one that shares none is another group, or an earlier communicator
    that used the same uuid, and is left alone. A member that gives up or times out writes
    the outcome too. The first member to arrive watches the absent ones (a conflicting
    uuid, a member that gave up elsewhere, an exited host) and ends the wait when it sees
    one.
    """
    n = len(handles)
    mine = handles[rank]
    digest = _digest(handles)
    base = f"{_PREFIX}/{key}"
    space = _space(key, digest)
    deadline = time.monotonic() + timeout.total_seconds()
    store.set(f"{base}/member/{mine}", json.dumps({"rank": rank, "digest": digest}))
    same = int(store.add(f"{space}/count", 1))
    if same == 1:  # the first with this list publishes it, then looks for disagreeing ones
        store.set(f"{space}/list", json.dumps({"rank": rank, "handles": handles}))
        store.append(f"{base}/digests", f"{digest},")
        _check_lists(store, key, rank, handles, digest)
    if same >= n:
        outcome = store.compare_set(f"{space}/outcome", "", _OK)
    elif same == 1:
        outcome = _watch(comm, store, key, rank, handles, deadline, seq, timeout)
    else:
        outcome = _wait_outcome(store, key, handles, deadline, timeout)
    _raise_outcome(outcome)


def _check_lists(store: Any, key: str, rank: int, handles: list[str], digest: str) -> None:
    """Raise :class:`_Disagreement` if a list registered under ``key`` before this one
    shares a member with it; the other list's space learns it too.

    Of two lists registered at the same time, the one registered second sees the first
    (registration is an append), so one of the two always finds the disagreement.
    """
    registered = store.get(f"{_PREFIX}/{key}/digests").decode("utf-8", "replace").split(",")
    others = sorted({d for d in registered if d and d != digest})
    if not others:
        return
    mine = set(handles)
    lists = store.multi_get([f"{_space(key, d)}/list" for d in others])
    for other, raw in zip(others, lists, strict=True):
        theirs = read_record(raw, f"{_space(key, other)}/list", _LIST)
        if mine.isdisjoint(h for h in theirs["handles"] if isinstance(h, str)):
            continue  # another group, or an earlier communicator's use of this uuid
        error = _Disagreement(
            f"reconfigure: members disagree on init_handles for uuid {key!r}: rank {rank} "
            f"passed {_short(handles)} but rank {theirs['rank']} passed "
            f"{_short(theirs['handles'])}; every member must pass the same list (or the "
            f"same set)"
        )
        outcome = json.dumps({"kind": "input", "message": str(error)})
        store.compare_set(f"{_space(key, other)}/outcome", "", outcome)
        raise error


def _raise_outcome(raw: bytes | str) -> None:
    """Return if the outcome says the group agreed, else raise what it says."""
    outcome = read_record(raw, "reconfigure outcome", _OUTCOME)
    kind = outcome["kind"]
    if kind == "ok":
        return
    message = str(outcome.get("message", "reconfigure failed"))
    if kind == "input":
        raise errors.CommInputError(message)
    if kind == "timeout":
        raise errors.CommTimeoutError(message)
    raise errors.CommOperationError(message)


def _absent(store: Any, base: str, handles: list[str], limit: int) -> list[int]:
    """Ranks (positions in ``handles``) of up to ``limit`` members that did not arrive."""
    return missing_keys(store, [f"{base}/member/{h}" for h in handles], limit)


def _timed_out(store: Any, key: str, handles: list[str], timeout: timedelta) -> _Absent:
    base = f"{_PREFIX}/{key}"
    absent = _absent(store, base, handles, _NAMED)
    try:
        count = len(handles) - int(store.add(f"{_space(key, _digest(handles))}/count", 0))
    except Exception:
        count = len(absent)
    count = max(count, len(absent))
    shown = _short([handles[r] for r in absent]) if absent else "(none named)"
    return _Absent(
        f"reconfigure: {count} of {len(handles)} members did not join uuid {key!r} within "
        f"{timeout}: {shown}; check that they are alive and call reconfigure with the same "
        f"uuid and handle list"
    )


def _wait_outcome(
    store: Any, key: str, handles: list[str], deadline: float, timeout: timedelta
) -> bytes:
    """Block until the uuid's outcome is written (one operation), or time out."""
    outcome_key = f"{_space(key, _digest(handles))}/outcome"
    remaining = max(deadline - time.monotonic(), 0.001)
    try:
        store.wait([outcome_key], timedelta(seconds=remaining))
    except Exception as exc:
        if not is_timeout_error(exc):
            raise
        raise _timed_out(store, key, handles, timeout) from None
    result: bytes = store.get(outcome_key)
    return result


def _watch(
    comm: TorchComm,
    store: Any,
    key: str,
    rank: int,
    handles: list[str],
    deadline: float,
    seq: int,
    timeout: timedelta,
) -> bytes:
    """The first member's wait: poll the outcome and look at the absent members."""
    base = f"{_PREFIX}/{key}"
    space = _space(key, _digest(handles))
    outcome_key = f"{space}/outcome"
    used = comm._membership.uuids
    mine = handles[rank]
    hosted = comm._membership.rendezvous is not None
    probed = time.monotonic()
    pause = 0.002
    while True:
        if store.check([outcome_key]):
            result: bytes = store.get(outcome_key)
            return result
        if int(store.add(f"{space}/count", 0)) < len(handles):
            absent = _absent(store, base, handles, _SCANNED)
            for r in absent:
                _look_at(store, key, r, handles, seq, used, mine)
            if hosted and time.monotonic() - probed > 0.25:  # a dead member fails it now
                probed = time.monotonic()
                for r in absent:
                    if has_exited(parse_handle(handles[r], comm.get_backend(), True, "member")):
                        raise errors.CommOperationError(
                            f"reconfigure: member {r} ({_brief(handles[r])}) has exited (its "
                            f"rendezvous refuses connections), so uuid {key!r} cannot "
                            f"complete; reconfigure with a new uuid and a list of live members"
                        )
        if time.monotonic() >= deadline:
            raise _timed_out(store, key, handles, timeout)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _look_at(
    store: Any, key: str, r: int, handles: list[str], seq: int, used: set[str], mine: str
) -> None:
    """Raise if absent member ``r`` gave up on this uuid or is busy with another one."""
    ann_key = f"{_PREFIX}/handle/{handles[r]}"
    if not store.check([ann_key]):
        return
    ann = read_record(store.get(ann_key), ann_key, _ANNOUNCEMENT)
    if ann["uuid"] == key and ann["state"] in ("failed", "mismatch"):
        error = errors.CommInputError if ann.get("kind") == "input" else errors.CommOperationError
        raise error(
            f"reconfigure: member {r} ({_brief(handles[r])}) gave up on uuid "
            f"{key!r}: {ann.get('error', 'its reconfigure failed')}"
        )
    if _conflicts(ann, key, seq, used) and _includes(store, ann, handles[r], mine):
        raise _UuidMismatch(
            f"reconfigure: member {r} ({_brief(handles[r])}) is reconfiguring with uuid "
            f"{ann['uuid']!r} instead of {key!r}; every member must pass the same uuid",
            ann["uuid"],
        )


def _all_built(store: Any, space: str, key: str, size: int, timeout: timedelta) -> None:
    """Return once every member has built its engine (two store operations per member).

    Without it a member that finished first could retire the engine at once (another
    reconfigure right away) and close connections a slower peer is still setting up: the
    peer's engine build then fails ("connection closed by peer"). A member whose build
    failed writes why, so the others stop waiting at once.
    """
    if size == 1:
        return
    done = f"{space}/built/all"
    if int(store.add(f"{space}/built/count", 1)) >= size:
        store.compare_set(done, "", _OK)
    try:
        store.wait([done], timeout)
    except Exception as exc:
        if not is_timeout_error(exc):
            raise
        built = int(store.add(f"{space}/built/count", 0))
        raise errors.CommTimeoutError(
            f"reconfigure: only {built} of {size} members built their engine for uuid "
            f"{key!r} within {timeout}; a member may have died after joining; reconfigure "
            f"again with a new uuid and a list of live members"
        ) from None
    _raise_outcome(store.get(done))


def _meeting_store(comm: TorchComm, handles: list[str], mine: str, timeout: timedelta) -> Any:
    """The store the members meet in: the one given to ``new_comm``, or the rendezvous that
    the first handle's member hosts (this communicator's own when the first handle is its)."""
    from torch._C._distributed_c10d import PrefixStore

    membership = comm._membership
    if membership.rendezvous is None or handles[0] == mine:
        if membership.rendezvous is not None:
            check_open_files(len(handles), "the rendezvous store this member hosts")
            membership.rendezvous.set_timeout(timeout)  # gloo's rendezvous waits use it
        return membership.root_store
    first = handles[0]
    cached = membership.clients.get(first)
    if cached is None:
        membership.clients.clear()  # one live connection: to the current first member
        where = "reconfigure"
        cached = connect(parse_handle(first, comm.get_backend(), True, where), timeout, where)
        # Signed as this member's own rendezvous is, with the job token (docs/security.md);
        # kept here, since the prefix below does not keep a Python store alive.
        cached = sign_like(membership.root_store, cached)
        membership.clients[first] = cached
    cached.set_timeout(timeout)  # gloo's rendezvous waits use the store's own timeout
    token = first.split(":", 3)[2]
    return PrefixStore(f"rendezvous/{token}", cached)


def _store_failure(
    comm: TorchComm, handles: list[str], exc: BaseException
) -> errors.CommOperationError:
    first = handles[0]
    comm._membership.clients.pop(first, None)
    return errors.CommOperationError(
        f"reconfigure: the rendezvous store (hosted by the member of the first handle, "
        f"{_brief(first)}) failed: {exc}; that member may have died. Reconfigure with a new "
        f"uuid and a list whose first handle is a live member"
    )


def reconfigure(
    comm: TorchComm,
    uuid: Any,
    init_handles: Any,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
) -> TorchWork:
    """``TorchComm.reconfigure``: see the module docstring."""
    from torch._C._distributed_c10d import PrefixStore

    op = "reconfigure"
    backend = comm.get_backend_impl()
    if not supports_reconfigure(type(backend)):
        raise RuntimeError(refusal(comm.get_backend(), type(backend), op))
    if not comm.get_options().enable_reconfigure:
        raise errors.CommStateError(
            f"reconfigure: communicator {comm.get_name()!r} was created with "
            f"enable_reconfigure=False; create it with new_comm(..., enable_reconfigure=True)"
        )
    if comm.is_finalized():
        raise errors.CommStateError(
            f"reconfigure: communicator {comm.get_name()!r} was finalized; "
            f"create a new one with new_comm(..., enable_reconfigure=True)"
        )
    key = _uuid_key(uuid)
    mine = comm.get_init_handle()  # enable_reconfigure: set at creation
    handles = _handle_list(
        init_handles, mine, comm.get_backend(), comm._membership.rendezvous is not None
    )
    timeout = check_timeout(timeout, op) if timeout is not None else comm.get_timeout()
    hints = dict(check_hints(hints, op)) if hints is not None else {}
    if key in comm._membership.uuids:
        raise errors.CommInputError(
            f"reconfigure: uuid {uuid!r} was already used by communicator {comm.get_name()!r}; "
            f"every reconfigure needs a new uuid (an increasing counter or uuid.uuid4().hex)"
        )
    comm._membership.uuids.add(key)
    rank, size = handles.index(mine), len(handles)
    space = _space(key, _digest(handles))

    prev_state = comm._unbind()
    _retire(comm, prev_state)

    store = _meeting_store(comm, handles, mine, timeout)
    seq = 0
    try:
        try:
            seq = int(store.add(f"{_PREFIX}/seq", 1))
            _announce(store, mine, key, "pending", seq)
            _meet(comm, store, key, rank, handles, timeout, seq)
        except errors.TorchCommError:
            raise
        except (RuntimeError, OSError) as exc:  # the store itself failed: its host is gone
            raise _store_failure(comm, handles, exc) from exc
        options = comm.get_options().replace(
            rank=rank,
            size=size,
            timeout=timeout,
            store=PrefixStore(f"{space}/engine", store),
            hints={**comm._default_hints(), **hints},
        )
        try:
            backend.reconfigure_engine(options.store, rank, size, timeout, options)
        except errors.TorchCommError:
            raise
        except Exception as exc:
            what = (
                f"reconfigure: backend {comm.get_backend()!r} could not build the engine "
                f"for uuid {key!r} as rank {rank} of {size}"
            )
            advice = "; a member may have died after joining; reconfigure again with a new uuid"
            raise engine_start_error(what, timeout, exc, advice) from exc
        _all_built(store, space, key, size, timeout)
    except BaseException as exc:
        try:  # withdraw, so members still waiting fail now instead of at their timeout
            kind = (
                "input"
                if isinstance(exc, errors.CommInputError)
                else "timeout"
                if isinstance(exc, _Absent)
                else "other"
            )
            message = (
                str(exc)
                if isinstance(exc, _GroupError)
                else f"reconfigure: member {rank} ({_brief(mine)}) gave up on uuid {key!r}: "
                f"{str(exc)[:600]}"
            )
            outcome = json.dumps({"kind": kind, "message": message})
            store.compare_set(f"{space}/outcome", "", outcome)
            store.compare_set(f"{space}/built/all", "", outcome)
            if isinstance(exc, _UuidMismatch):
                _announce(store, mine, key, "mismatch", seq, exc.other, exc)
            else:
                _announce(store, mine, key, "failed", seq, error=exc)
        except Exception:
            pass
        if isinstance(exc, _GroupError):  # the public type, without the marker
            public = (
                errors.CommInputError
                if isinstance(exc, errors.CommInputError)
                else errors.CommTimeoutError
            )
            raise public(str(exc)) from None
        raise
    try:
        _announce(store, mine, key, "done", seq)
    except Exception:  # bound already; a store that just went away no longer matters
        pass

    group = PrefixStore(f"{space}/group", store)
    comm._rebind(rank, size, group, options)  # splits, windows and bridge groups meet there
    return TorchWork(None, None, comm, op)
