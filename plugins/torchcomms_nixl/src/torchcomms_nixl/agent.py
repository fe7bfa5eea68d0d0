"""The process's NIXL agent: registrations, peers, transfers, and the protocol that keeps
memory safe when a peer holds a key to memory that is being released.

One agent serves every ``RdmaTransport`` and ``RdmaMemory`` of the process (NIXL registers
memory per agent, and the reference's ``RdmaMemory(tensor)`` names no transport). A service
thread reads NIXL notifications, which carry three messages between agents:

``hello``
    sent by ``connect`` once the peer's metadata is loaded; ``connect`` returns when the
    peer's hello for this endpoint arrived, so both agents can notify each other. It carries
    the sender's live exposures and the next exposure number: a key older than the
    connection is valid only if it was live then.
``s<endpoint>`` (a signal)
    one more signal to that endpoint of this agent (``RdmaTransport.signal``), sent once the
    sender's transfers before it completed; counted when read. Waiters read notifications
    themselves (``progress``), so a signal is seen as soon as it arrives rather than at the
    service thread's next poll.
``wake``
    sent by a transfer to a target that has not heard from this process for half a second:
    the target's service thread then polls every ``TORCHCOMM_NIXL_PROGRESS_US`` for a
    second (the agent runs without NIXL's progress thread, and a target over TCP takes part
    in every transfer), and every 2 ms once traffic stops.
``p`` + exposure + address + bytes (a posted write)
    ``RdmaTransport.post_write``: bytes for memory this agent exposed, which it copies in
    when it reads the message, after checking that the exposure is live and the bytes lie
    inside it (else the message is dropped). Notifications between two agents arrive in
    order, so a signal sent after a posted write is read after it: the peer that sees the
    signal sees the bytes. Over TCP this is one trip where a write is a round trip (UCX
    completes a write once the target acknowledged it). Host memory only.
``flush`` / ``flushed``
    ``RdmaTransport.flush``: answered once every earlier message was handled, so every
    posted write before it is in place.
``revoke`` / ``revoked``
    releasing memory a peer may hold a key to sends ``revoke`` to every connected agent and
    deregisters only once each answered ``revoked`` (or died, or the timeout passed). A
    peer marks the exposure revoked under the lock its transfers hold while they run, so
    after its answer no transfer into that memory is running or can start: NIXL itself
    would let a stale key write into memory that was deregistered and reused.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import dataclasses
import itertools
import json
import os
import secrets
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import (
    CommInputError,
    CommOperationError,
    CommStateError,
    CommTimeoutError,
)

from . import engine
from .keys import Address, Key, decode_key, encode_key

#: Prefix of this plugin's notifications (other NIXL users of the agent are ignored).
_TAG = b"torchcomms-nixl/1 "
#: Prefix of a signal: the receiving endpoint's number follows in decimal (the one message
#: on a fast path, so neither JSON nor the protocol's dispatch).
_SIGNAL = b"torchcomms-nixl/1 s"
#: Prefix of a posted write: the exposure and the address (two little-endian int64), then
#: the bytes to write there.
_POST = b"torchcomms-nixl/1 p"
_POST_HEADER = struct.Struct("<qq")
#: The largest posted write (a notification carries it whole).
MAX_POST_BYTES = 64 << 10
#: How often the service thread polls (each poll progresses UCX): every
#: ``engine.progress_us()`` for ``_ACTIVE_S`` after the last sign of traffic (a
#: notification in, a transfer out), else every ``_POLL_QUIET_S`` while a peer is connected
#: and ``_POLL_IDLE_S`` while none is.
_ACTIVE_S = 1.0
_POLL_QUIET_S = 0.002
_POLL_IDLE_S = 0.005
#: A transfer first tells a target that has not heard from this process for this many
#: seconds to poll quickly (a ``wake``), since a target over TCP must take part.
_NUDGE_S = 0.5
#: Seconds a transfer is polled flat out before the poll yields the CPU, then naps.
_SPIN_S = 0.0002
_NAP_S = 0.00005
#: Prepared transfers kept for reposting (NIXL reposts one in a few microseconds).
_HANDLE_CACHE = 128
#: Default seconds to wait for revocation answers (``TORCHCOMM_TIMEOUT_SECONDS`` if set).
_DEFAULT_TIMEOUT_S = 600.0


def _default_timeout_s() -> float:
    try:
        return float(os.environ.get("TORCHCOMM_TIMEOUT_SECONDS", "") or _DEFAULT_TIMEOUT_S)
    except ValueError:
        return _DEFAULT_TIMEOUT_S


def memory_of(tensor: torch.Tensor) -> tuple[str, int]:
    """NIXL's memory type and device id of ``tensor``'s memory."""
    if tensor.device.type == "cuda":
        return "VRAM", tensor.device.index or 0
    return "DRAM", 0


@dataclasses.dataclass(eq=False)
class Region:
    """Memory registered with NIXL; ``tensor`` keeps it alive until it is deregistered."""

    ident: int
    base: int
    nbytes: int
    mem_type: str
    device_id: int
    descs: Any
    tensor: torch.Tensor | None
    refs: int = 1
    metadata: bytes | None = None

    def covers(self, addr: int, nbytes: int, mem_type: str, device_id: int) -> bool:
        return (
            self.tensor is not None
            and (mem_type, device_id) == (self.mem_type, self.device_id)
            and self.base <= addr
            and addr + nbytes <= self.base + self.nbytes
            # A storage resized under the registration no longer owns these addresses.
            and self.tensor.untyped_storage().nbytes() > 0
        )


@dataclasses.dataclass(eq=False)
class _Peer:
    """What this agent knows of another agent's exposures."""

    live: frozenset[int] | None = None  # from its first hello; None until then
    next_exposure: int = 0
    revoked: set[int] = dataclasses.field(default_factory=set)
    loaded: set[int] = dataclasses.field(default_factory=set)  # exposures whose metadata is in
    dead: bool = False

    def allows(self, exposure: int) -> bool:
        if self.live is None or exposure in self.revoked:
            return False
        return exposure in self.live or exposure >= self.next_exposure


@dataclasses.dataclass(eq=False)
class _Release:
    """A registration being released: who must still answer, until when, what follows."""

    exposure: int | None
    region: Region
    waiting: set[str]
    deadline: float
    done: threading.Event


class Agent:
    """The NIXL agent of this process (see the module docstring); made by :func:`agent`."""

    def __init__(self) -> None:
        self._b = engine.bindings()
        self._progress_s = engine.progress_us() / 1e6  # a bad value is refused before starting
        #: Until when the service thread polls every ``_progress_s`` (see ``_ACTIVE_S``).
        self.active_until = 0.0
        self._nudged: dict[str, float] = {}  # peer agent -> when it was last told to wake
        self.name = f"torchcomms-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            self._nixl, ucx = engine.start_agent(self.name)
        except Exception as exc:
            raise CommStateError(
                f"NIXL could not start an agent ({type(exc).__name__}: {exc}); check that the "
                f"nixl-cu12 wheel is complete (`pip install --force-reinstall nixl-cu12`)"
            ) from None
        self._ucx = [ucx]
        self._mem = {"DRAM": self._b.DRAM_SEG, "VRAM": self._b.VRAM_SEG}
        self._ops = {"WRITE": self._b.NIXL_WRITE, "READ": self._b.NIXL_READ}
        self._in_progress = self._b.NIXL_IN_PROG
        self._success = self._b.NIXL_SUCCESS
        #: Every call into NIXL and every change of the state below holds this lock.
        self._lock = threading.RLock()
        #: Held by a transfer while it runs and by the handling of a revocation.
        self._guard = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._ids = itertools.count(1)
        self._regions: list[Region] = []
        #: exposure -> (its region, the exposed bytes' start and length)
        self._exposures: dict[int, tuple[Region, int, int]] = {}
        self._next_exposure = 1
        self._connected: set[str] = set()  # agents whose metadata is loaded: they get revokes
        self._peers: dict[str, _Peer] = {}
        self._hellos: dict[tuple[str, int], int] = {}  # (agent, our endpoint) -> theirs
        self._signals: collections.Counter[int] = collections.Counter()  # our endpoint -> count
        #: Signals received from other agents since the agent started (for tests and tools).
        self.signals_received = 0
        #: Posted writes copied in since the agent started (for tests and tools).
        self.posts_applied = 0
        #: Notifications read since the agent started, by any thread.
        self.notes_read = 0
        self._flushed: set[int] = set()  # our flush numbers the peer answered
        self._releases: list[_Release] = []
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._keys: collections.OrderedDict[str, Key] = collections.OrderedDict()
        self._handles: collections.OrderedDict[tuple[Any, ...], tuple[Any, int, str, int]] = (
            collections.OrderedDict()
        )
        self.revocation_timeout_s = _default_timeout_s()
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(
            target=self._serve, name="torchcomms-nixl-service", daemon=True
        )
        self._thread.start()
        # Before the interpreter freezes daemon threads: a frozen service thread would keep
        # the lock that finalisers (RdmaTransport.__del__, ...) take.
        atexit.register(self.shutdown)

    def shutdown(self) -> None:
        """Stop the service thread and the NIXL agent (at exit; later calls do nothing)."""
        if self._stopping:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join(5.0)
        with self._lock:
            for handle, *_rest in self._handles.values():
                self._release_handle(handle)
            self._handles.clear()
            self._nixl = None  # the agent stops its own threads as it goes

    def _running(self, where: str) -> None:
        if self._stopping:
            raise CommStateError(f"{where}: the process is exiting; the NIXL agent has stopped")

    # -- registration -------------------------------------------------------------------

    def register(self, tensor: torch.Tensor) -> tuple[Region, bool]:
        """The region covering ``tensor``'s bytes (reused when one does), and whether reused."""
        self._running("RdmaMemory")
        mem_type, device_id = memory_of(tensor)
        addr = tensor.data_ptr()
        nbytes = tensor.numel() * tensor.element_size()
        with self._lock:
            for region in self._regions:
                if region.refs > 0 and region.covers(addr, nbytes, mem_type, device_id):
                    region.refs += 1
                    return region, True
            try:
                descs = self._b.nixlRegDList(self._mem[mem_type], [(addr, nbytes, device_id, "")])
                self._nixl.registerMem(descs, self._ucx)
            except Exception as exc:
                raise CommOperationError(
                    f"RdmaMemory: NIXL could not register {nbytes} bytes of {mem_type} memory "
                    f"({type(exc).__name__}: {exc})"
                ) from None
            region = Region(next(self._ids), addr, nbytes, mem_type, device_id, descs, tensor)
            self._regions.append(region)
            return region, False

    def expose(self, region: Region, base: int, nbytes: int) -> tuple[int, str]:
        """A new exposure of ``nbytes`` at ``base`` of ``region``: its number and key."""
        with self._lock:
            if region.metadata is None:
                region.metadata = bytes(
                    self._nixl.getLocalPartialMD(region.descs, False, self._ucx)
                )
            exposure = self._next_exposure
            self._next_exposure += 1
            self._exposures[exposure] = (region, base, nbytes)
        key = Key(
            self.name, exposure, base, nbytes, region.mem_type, region.device_id, region.metadata
        )
        return exposure, encode_key(key)

    def release(self, region: Region, exposure: int | None, wait: bool) -> None:
        """Give up one reference to ``region`` (and ``exposure``), revoking it at peers first.

        ``wait``: return once done. Otherwise (from a finaliser) the service thread does it;
        the region keeps its tensor alive until then.
        """
        if self._stopping:
            return  # at exit: the process's memory goes with it
        done = threading.Event()
        self._queue.append(("release", region, exposure, done))
        self._wake.set()
        if wait and threading.current_thread() is not self._thread:
            done.wait(self.revocation_timeout_s + 5.0)

    # -- peers --------------------------------------------------------------------------

    def connection_metadata(self) -> bytes:
        with self._lock:
            empty = self._b.nixlRegDList(self._b.DRAM_SEG)
            return bytes(self._nixl.getLocalPartialMD(empty, True, self._ucx))

    def new_endpoint_id(self) -> int:
        return next(self._ids)

    def connect(self, endpoint: int, peer: Address, timeout: timedelta) -> None:
        """Load the peer's metadata, say hello, and wait for the peer's hello to ``endpoint``."""
        self._running("connect")
        deadline = time.monotonic() + timeout.total_seconds()
        with self._lock:
            if peer.agent == self.name:
                # Loopback: two endpoints of this process. No metadata to load, no messages.
                state = self._peers.setdefault(peer.agent, _Peer())
                if state.live is None:
                    state.live, state.next_exposure = frozenset(), 1
                self._connected.add(peer.agent)
                self._hellos[(peer.agent, peer.endpoint)] = endpoint
                self._changed.notify_all()
                return
            else:
                try:
                    self._nixl.loadRemoteMD(peer.metadata)
                except Exception as exc:
                    raise CommOperationError(
                        f"connect: NIXL could not load the peer's address "
                        f"({type(exc).__name__}: {exc}); pass the peer's bind() unchanged"
                    ) from None
                self._connected.add(peer.agent)
                state = self._peers.setdefault(peer.agent, _Peer())
                state.dead = False
                hello = {
                    "t": "hello",
                    "from": endpoint,
                    "to": peer.endpoint,
                    "live": sorted(self._exposures),
                    "next": self._next_exposure,
                }
                self._send(peer.agent, hello)
            self._wake.set()
            while self._hellos.get((peer.agent, endpoint)) != peer.endpoint:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeoutError(
                        f"connect: the peer (agent {peer.agent}) did not connect back within "
                        f"{timeout.total_seconds():g} s; both sides must call connect() with "
                        f"the other's bind() (timed out)"
                    )
                self._changed.wait(min(left, 0.05))

    def disconnect(self, endpoint: int) -> None:
        if self._stopping:
            return
        with self._lock:
            for key in [k for k in self._hellos if k[1] == endpoint]:
                del self._hellos[key]
            self._signals.pop(endpoint, None)

    # -- signals ------------------------------------------------------------------------

    def signal(self, peer: Address) -> None:
        """One signal to endpoint ``peer.endpoint`` of ``peer.agent``.

        Transfers are blocking and complete only once their bytes are at the target, so a
        notification sent now arrives after them.
        """
        self._running("signal")
        if peer.agent == self.name:  # loopback: count it here
            with self._lock:
                self._signals[peer.endpoint] += 1
            return
        with self._lock:
            state = self._peers.get(peer.agent)
            if state is not None and state.dead:
                raise CommOperationError(
                    f"signal: the peer (agent {peer.agent}) disconnected earlier (it died or "
                    f"closed); connect a new RdmaTransport to a live peer"
                )
            try:
                self._nixl.genNotif(peer.agent, _SIGNAL + str(peer.endpoint).encode("ascii"))
            except Exception as exc:
                if state is not None:
                    state.dead = True
                self._drop_peer(peer.agent)
                raise CommOperationError(
                    f"signal: NIXL could not reach the peer (agent {peer.agent}): it died or "
                    f"closed its transport ({type(exc).__name__}: {exc})"
                ) from None

    def signals(self, endpoint: int) -> int:
        """Signals received by ``endpoint`` so far, after reading what has arrived."""
        if not self._stopping:
            self.progress()
        return self._signals.get(endpoint, 0)

    def progress(self) -> None:
        """Read the notifications that arrived (NIXL progresses UCX as it does), and act on
        them: what the service thread does on each poll, for a caller that waits now."""
        rest = self._fetch()
        if rest:
            self._queue.extend(("note", sender, message) for sender, message in rest)
            self._wake.set()

    def _fetch(self) -> list[tuple[str, bytes]]:
        """Read the notifications that arrived, acting on signals and posted writes before
        the lock is let go, so that whichever thread reads which, a signal is never counted
        before a posted write that arrived ahead of it is in place. The rest, in order."""
        rest: list[tuple[str, bytes]] = []
        with self._lock:
            notes = self._nixl.getNotifs({}, self._ucx)
            for sender, messages in notes.items():
                for message in messages:
                    message = bytes(message)
                    if not self._take_fast(message):
                        rest.append((str(sender), message))
            self.notes_read += sum(len(messages) for messages in notes.values())
        return rest

    def _take_fast(self, message: bytes) -> bool:
        """Act on a signal or a posted write (the lock is held); False for anything else,
        which the service thread handles."""
        if message.startswith(_SIGNAL):
            self._count_signal(message)
        elif message.startswith(_POST):
            self._apply_post(message)
        else:
            return False
        return True

    def _count_signal(self, message: bytes) -> None:
        try:
            self._signals[int(message[len(_SIGNAL) :])] += 1
        except ValueError:
            return  # not one of ours
        self.signals_received += 1

    # -- transfers ----------------------------------------------------------------------

    def transfer(
        self,
        op: str,
        peer_agent: str,
        region: Region,
        addr: int,
        nbytes: int,
        remote: Any,
        timeout: timedelta,
    ) -> None:
        """``op`` ("WRITE" or "READ") of ``nbytes`` between ``addr`` and ``remote``, blocking."""
        where = op.lower()
        key = self._checked_key(where, peer_agent, remote)
        now = time.monotonic()
        deadline = now + timeout.total_seconds()
        self.active_until = now + _ACTIVE_S  # our side of the transfer: keep polling too
        if now - self._nudged.get(key.agent, -_NUDGE_S) >= _NUDGE_S and key.agent != self.name:
            self._nudged[key.agent] = now
            self._send(key.agent, {"t": "wake"})
        with self._guard:
            handle = self._prepare(where, op, key, region, addr, nbytes, remote.ptr)
            self._run(where, handle, key, deadline, timeout)

    def _checked_key(self, where: str, peer_agent: str, remote: Any) -> Key:
        """The key of ``remote``, once it is the connected peer's and covers the bytes."""
        self._running(where)
        key = self._key(where, remote.access_key)
        if key.agent != peer_agent:
            raise CommInputError(
                f"{where}: the remote buffer belongs to agent {key.agent}, but this "
                f"RdmaTransport is connected to {peer_agent}; use a transport connected to the "
                f"buffer's owner. Nothing was transferred"
            )
        if remote.ptr < key.base or remote.ptr + remote.len > key.base + key.nbytes:
            raise CommInputError(
                f"{where}: the remote buffer ({remote.len} bytes at {remote.ptr:#x}) is not "
                f"inside the memory its key exposes ({key.nbytes} bytes at {key.base:#x}); "
                f"narrow it within that range. Nothing was transferred"
            )
        return key

    # -- posted writes ------------------------------------------------------------------

    def post_write(self, peer_agent: str, addr: int, nbytes: int, remote: Any) -> None:
        """Send the ``nbytes`` at ``addr`` for ``remote`` in a notification; see the module
        docstring. Checked here as a transfer is, and again by the owner on arrival."""
        where = "post_write"
        key = self._checked_key(where, peer_agent, remote)
        if key.mem_type != "DRAM":
            raise CommInputError(
                f"{where}: the remote buffer is {key.mem_type} memory; posted writes reach host "
                f"memory only (use write)"
            )
        message = b"".join(
            (_POST, _POST_HEADER.pack(key.exposure, remote.ptr), ctypes.string_at(addr, nbytes))
        )
        with self._guard, self._lock:
            self._usable_peer(where, key)
            if key.agent == self.name:
                self._apply_post(message)
                return
            try:
                self._nixl.genNotif(key.agent, message)
            except Exception as exc:
                raise self._failure(where, key.agent, exc) from None

    def _apply_post(self, message: bytes) -> None:
        """Copy a posted write into memory this agent exposed (the lock is held)."""
        exposure, addr = _POST_HEADER.unpack_from(message, len(_POST))
        start = len(_POST) + _POST_HEADER.size
        nbytes = len(message) - start
        found = self._exposures.get(exposure)
        if found is None or found[0].mem_type != "DRAM":
            return  # released (a late message), or not ours to write
        region, base, size = found
        if not (base <= addr and addr + nbytes <= base + size):
            return
        if not region.covers(addr, nbytes, "DRAM", region.device_id):
            return
        source = ctypes.cast(ctypes.c_char_p(message), ctypes.c_void_p).value
        assert source is not None
        ctypes.memmove(addr, source + start, nbytes)  # from the message's own buffer
        self.posts_applied += 1

    def flush(self, peer_agent: str, timeout: timedelta) -> None:
        """Return once ``peer_agent`` handled every message this agent sent it before."""
        self._running("flush")
        if peer_agent == self.name:
            return
        deadline = time.monotonic() + timeout.total_seconds()
        number = next(self._ids)
        if not self._send(peer_agent, {"t": "flush", "id": number}):
            raise CommOperationError(
                f"flush: the peer (agent {peer_agent}) cannot be reached (it died or closed)"
            )
        while True:
            self.progress()
            with self._lock:
                if number in self._flushed:
                    self._flushed.discard(number)
                    return
                state = self._peers.get(peer_agent)
                if state is not None and state.dead:
                    raise CommOperationError(
                        f"flush: the peer (agent {peer_agent}) disconnected (it died or closed)"
                    )
                left = deadline - time.monotonic()
                if left <= 0:
                    raise CommTimeoutError(
                        f"flush: the peer (agent {peer_agent}) did not answer within "
                        f"{timeout.total_seconds():g} s (timed out); it may be hung"
                    )
                self._changed.wait(min(left, 0.0002))

    def _key(self, where: str, text: str) -> Key:
        key = self._keys.get(text)
        if key is None:
            key = decode_key(where, text)
            with self._lock:
                self._keys[text] = key
                while len(self._keys) > 1024:
                    self._keys.popitem(last=False)
        return key

    def _prepare(
        self, where: str, op: str, key: Key, region: Region, addr: int, nbytes: int, rptr: int
    ) -> Any:
        """A posted-before or new NIXL transfer; every check that needs the guard first."""
        with self._lock:
            state = self._usable_peer(where, key)
            cache_key = (op, key.agent, key.exposure, region.ident, addr, rptr, nbytes)
            found = self._handles.get(cache_key)
            if found is not None:
                self._handles.move_to_end(cache_key)
                return found[0]
            if key.exposure not in state.loaded and key.agent != self.name:
                try:
                    self._nixl.loadRemoteMD(key.metadata)
                except Exception as exc:
                    raise CommOperationError(
                        f"{where}: NIXL could not load the remote buffer's registration "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
                state.loaded.add(key.exposure)
            local = self._b.nixlXferDList(
                self._mem[region.mem_type], [(addr, nbytes, region.device_id)]
            )
            far = self._b.nixlXferDList(self._mem[key.mem_type], [(rptr, nbytes, key.device_id)])
            try:
                handle = self._nixl.createXferReq(
                    self._ops[op], local, far, key.agent, b"", self._ucx
                )
            except Exception as exc:
                raise self._failure(where, key.agent, exc) from None
            self._handles[cache_key] = (handle, region.ident, key.agent, key.exposure)
            while len(self._handles) > _HANDLE_CACHE:
                _k, (old, *_rest) = self._handles.popitem(last=False)
                self._release_handle(old)
            return handle

    def _usable_peer(self, where: str, key: Key) -> _Peer:
        """The peer of ``key``, once it is connected, alive, and still exposes the memory
        (the lock is held)."""
        state = self._peers.get(key.agent)
        if state is None or state.live is None:
            raise CommStateError(
                f"{where}: agent {key.agent} is not connected to this process. Nothing was "
                f"transferred"
            )
        if state.dead:
            raise CommOperationError(
                f"{where}: the peer (agent {key.agent}) disconnected earlier (it died or "
                f"closed); connect a new RdmaTransport to a live peer"
            )
        if not state.allows(key.exposure):
            raise CommStateError(
                f"{where}: the peer released the memory of this remote buffer (its "
                f"RdmaMemory was closed or collected); ask the peer for a fresh "
                f"to_remote_buffer(). Nothing was transferred"
            )
        return state

    def _run(self, where: str, handle: Any, key: Key, deadline: float, timeout: timedelta) -> None:
        nixl, lock, in_progress = self._nixl, self._lock, self._in_progress
        try:
            with lock:
                status = nixl.postXferReq(handle, b"")
            spin_until = time.monotonic() + _SPIN_S
            while status == in_progress:
                with lock:
                    status = nixl.getXferStatus(handle)
                if status != in_progress:
                    break
                now = time.monotonic()
                if now > deadline:
                    self._forget(handle)
                    raise CommTimeoutError(
                        f"{where}: the transfer to agent {key.agent} did not finish within "
                        f"{timeout.total_seconds():g} s (timed out); the peer may be hung or "
                        f"the link down"
                    )
                if now > spin_until:
                    time.sleep(_NAP_S)
                else:
                    os.sched_yield()
        except (CommTimeoutError, CommOperationError):
            raise
        except Exception as exc:
            self._forget(handle)
            raise self._failure(where, key.agent, exc) from None
        if status != self._success:
            self._forget(handle)
            raise CommOperationError(
                f"{where}: NIXL reported the transfer to agent {key.agent} failed (status "
                f"{status}); the peer may have died or deregistered the memory"
            )

    def _failure(self, where: str, peer: str, exc: Exception) -> Exception:
        kind = type(exc).__name__
        if "Disconnect" in kind:
            with self._lock:
                state = self._peers.get(peer)
                if state is not None:
                    state.dead = True
                self._drop_peer(peer)
            return CommOperationError(
                f"{where}: the peer (agent {peer}) disconnected (it died or closed its "
                f"transport); nothing more can be transferred with it ({kind})"
            )
        return CommOperationError(
            f"{where}: NIXL failed the transfer to agent {peer} ({kind}: {exc})"
        )

    def _forget(self, handle: Any) -> None:
        with self._lock:
            for cache_key, value in list(self._handles.items()):
                if value[0] is handle:
                    del self._handles[cache_key]
            self._release_handle(handle)

    def _release_handle(self, handle: Any) -> None:
        try:
            self._nixl.releaseXferReq(handle)
        except Exception:  # still active (a dead peer): NIXL keeps it until the agent goes
            pass

    # -- the service thread -------------------------------------------------------------

    def _serve(self) -> None:
        busy_pause = self._progress_s
        while not self._stopping:
            busy = False
            try:
                read = self.notes_read
                rest = self._fetch()
                busy = self.notes_read != read
                while self._queue:  # read earlier, by a waiter's progress(): first
                    busy = True
                    kind, *what = self._queue.popleft()
                    if kind == "note":
                        self._handle(*what)
                    else:
                        self._start_release(*what)
                for sender, message in rest:
                    self._handle(sender, message)
                if self._releases:
                    busy = True
                    self._finish_releases()
            except Exception:  # keep serving: one bad message must not stop the protocol
                pass
            now = time.monotonic()
            if busy:
                self.active_until = now + _ACTIVE_S
            if now < self.active_until:
                # Traffic: poll often (a plain sleep is the cheapest wait).
                if busy_pause == 0:
                    os.sched_yield()
                else:
                    time.sleep(busy_pause)
            elif self._connected:
                time.sleep(_POLL_QUIET_S)
            else:  # nobody to serve: waiting for work queued here (a release, a connect)
                self._wake.wait(_POLL_IDLE_S)
                self._wake.clear()

    def _handle(self, sender: str, message: bytes) -> None:
        if message.startswith((_SIGNAL, _POST)):
            with self._lock:
                self._take_fast(message)
            return
        if not message.startswith(_TAG):
            return
        body = json.loads(message[len(_TAG) :])
        kind = body.get("t")
        if kind == "hello":
            with self._lock:
                state = self._peers.setdefault(sender, _Peer())
                if state.live is None:
                    state.live = frozenset(int(e) for e in body["live"])
                    state.next_exposure = int(body["next"])
                self._hellos[(sender, int(body["to"]))] = int(body["from"])
                self._changed.notify_all()
        elif kind == "revoke":
            ids = [int(e) for e in body["ids"]]
            with self._guard, self._lock:  # no transfer runs while the exposure is revoked
                state = self._peers.setdefault(sender, _Peer())
                state.revoked.update(ids)
                for cache_key, value in list(self._handles.items()):
                    if value[2] == sender and value[3] in ids:
                        del self._handles[cache_key]
                        self._release_handle(value[0])
                self._send(sender, {"t": "revoked", "ids": ids})
        elif kind == "flush":  # every earlier message of the sender was handled
            self._send(sender, {"t": "flushed", "id": int(body["id"])})
        elif kind == "flushed":
            with self._lock:
                self._flushed.add(int(body["id"]))
                self._changed.notify_all()
        elif kind == "revoked":
            answered = {int(e) for e in body["ids"]}
            with self._lock:
                for release in self._releases:
                    if release.exposure in answered:
                        release.waiting.discard(sender)

    def _send(self, agent: str, body: dict[str, Any]) -> bool:
        """Notify ``agent``; False (and the agent counts as dead) when it cannot be reached."""
        data = _TAG + json.dumps(body, separators=(",", ":")).encode("ascii")
        with self._lock:
            try:
                self._nixl.genNotif(agent, data)
            except Exception:
                state = self._peers.get(agent)
                if state is not None:
                    state.dead = True
                self._drop_peer(agent)
                return False
        return True

    def _drop_peer(self, agent: str) -> None:
        """Nobody waits for ``agent`` any more (it died)."""
        self._connected.discard(agent)
        for release in self._releases:
            release.waiting.discard(agent)

    def _start_release(self, region: Region, exposure: int | None, done: threading.Event) -> None:
        with self._lock:
            waiting: set[str] = set()
            if exposure is not None and self._exposures.pop(exposure, None) is not None:
                for agent in sorted(self._connected):
                    if agent == self.name:
                        self._peers[agent].revoked.add(exposure)
                    elif self._send(agent, {"t": "revoke", "ids": [exposure]}):
                        waiting.add(agent)
            deadline = time.monotonic() + self.revocation_timeout_s
            self._releases.append(_Release(exposure, region, waiting, deadline, done))
        if exposure is not None and self.name in self._connected:
            # Loopback transfers into this exposure: none may run past this point.
            with self._guard:
                pass
        self._finish_releases()

    def _finish_releases(self) -> None:
        now = time.monotonic()
        with self._lock:
            finished = [r for r in self._releases if not r.waiting or now > r.deadline]
            self._releases = [r for r in self._releases if r not in finished]
            for release in finished:
                self._unref(release.region)
                release.done.set()

    def _unref(self, region: Region) -> None:
        region.refs -= 1
        if region.refs > 0:
            return
        for cache_key, value in list(self._handles.items()):
            if value[1] == region.ident:
                del self._handles[cache_key]
                self._release_handle(value[0])
        try:
            self._nixl.deregisterMem(region.descs, self._ucx)
        except Exception:
            pass  # the agent is going away, or the memory already was
        region.tensor = None
        if region in self._regions:
            self._regions.remove(region)

    # -- introspection for tests and the CLI --------------------------------------------

    def registered_regions(self) -> int:
        with self._lock:
            return len(self._regions)

    def pending_releases(self) -> int:
        with self._lock:
            return len(self._releases) + len(self._queue)


_agent: Agent | None = None
_agent_pid = -1
_agent_lock = threading.Lock()


def agent() -> Agent:
    """This process's agent, started on first use (again in a forked child)."""
    global _agent, _agent_pid
    with _agent_lock:
        if _agent is None or _agent_pid != os.getpid():
            _agent, _agent_pid = Agent(), os.getpid()
        return _agent
