"""The agent's state and the calls every part of it makes: sending a message, reading the
notifications that arrived, acting on signals and posted writes, and turning a NIXL failure
into a torchcomms error.

``AgentBase`` is the base of :class:`~torchcomms_nixl.agent.Agent`; the transfers
(``transfers``) and the service thread (``service``) build on it. Imports the plugin's
records, wire format, keys and engine, never the modules above it.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import os
import secrets
import socket
import threading
from typing import Any

from torchcomms_core.plugin import CommOperationError, CommStateError

from . import engine
from .keys import Key
from .records import Peer, Region, Release, default_timeout_s
from .wire import POST, POST_HEADER, SIGNAL, encode


class AgentBase:
    """The state of the process's NIXL agent and its shared helpers (see ``agent``)."""

    def __init__(self) -> None:
        self._b = engine.bindings()
        self._progress_s = engine.progress_us() / 1e6  # a bad value is refused before starting
        #: Until when the service thread polls every ``_progress_s`` (see ``ACTIVE_S``).
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
        self._peers: dict[str, Peer] = {}
        self._hellos: dict[tuple[str, int], int] = {}  # (agent, our endpoint) -> theirs
        self._signals: collections.Counter[int] = collections.Counter()  # our endpoint -> count
        #: Signals received from other agents since the agent started (for tests and tools).
        self.signals_received = 0
        #: Posted writes copied in since the agent started (for tests and tools).
        self.posts_applied = 0
        #: Notifications read since the agent started, by any thread.
        self.notes_read = 0
        self._flushed: set[int] = set()  # our flush numbers the peer answered
        self._releases: list[Release] = []
        self._queue: collections.deque[tuple[Any, ...]] = collections.deque()
        self._keys: collections.OrderedDict[str, Key] = collections.OrderedDict()
        self._handles: collections.OrderedDict[tuple[Any, ...], tuple[Any, int, str, int]] = (
            collections.OrderedDict()
        )
        self.revocation_timeout_s = default_timeout_s()
        self._wake = threading.Event()
        self._stopping = False

    def _running(self, where: str) -> None:
        if self._stopping:
            raise CommStateError(f"{where}: the process is exiting; the NIXL agent has stopped")

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
        if message.startswith(SIGNAL):
            self._count_signal(message)
        elif message.startswith(POST):
            self._apply_post(message)
        else:
            return False
        return True

    def _count_signal(self, message: bytes) -> None:
        try:
            self._signals[int(message[len(SIGNAL) :])] += 1
        except ValueError:
            return  # not one of ours
        self.signals_received += 1

    def _apply_post(self, message: bytes) -> None:
        """Copy a posted write into memory this agent exposed (the lock is held)."""
        exposure, addr = POST_HEADER.unpack_from(message, len(POST))
        start = len(POST) + POST_HEADER.size
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

    def _load_remote(self, where: str, metadata: bytes, what: str, fix: str = "") -> None:
        """Load another agent's NIXL metadata (the lock is held); a failure raises
        ``CommOperationError`` naming ``what`` could not be loaded, then ``fix``."""
        try:
            self._nixl.loadRemoteMD(metadata)
        except Exception as exc:
            raise CommOperationError(
                f"{where}: NIXL could not load {what} ({type(exc).__name__}: {exc}){fix}"
            ) from None

    def _send(self, agent: str, body: dict[str, Any]) -> bool:
        """Notify ``agent``; False (and the agent counts as dead) when it cannot be reached."""
        data = encode(body)
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

    def _release_handle(self, handle: Any) -> None:
        try:
            self._nixl.releaseXferReq(handle)
        except Exception:  # still active (a dead peer): NIXL keeps it until the agent goes
            pass
