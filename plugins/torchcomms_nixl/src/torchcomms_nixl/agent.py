"""The process's NIXL agent: registrations, peers, transfers, and the protocol that keeps
memory safe when a peer holds a key to memory that is being released.

One agent serves every ``RdmaTransport`` and ``RdmaMemory`` of the process (NIXL registers
memory per agent, and the reference's ``RdmaMemory(tensor)`` names no transport). A service
thread reads NIXL notifications, which carry the protocol's messages between agents
(``hello``, signals, ``wake``, posted writes, ``flush`` and ``revoke``: see ``wire``).

The agent is made of parts, one concern each:
``records`` (what it keeps), ``base`` (its state, sending and reading messages),
``transfers`` (write, read, posted writes, flush) and ``service`` (the service thread and
the revocation protocol); this module adds registration, peers and signals, and
:func:`agent`, the process's one agent. It imports those parts; none imports it.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from datetime import timedelta

import torch

from torchcomms_core.plugin import CommOperationError, CommTimeoutError

from .keys import Address, Key, encode_key
from .records import Peer, Region, memory_of
from .service import Service
from .transfers import Transfers
from .wire import SIGNAL

__all__ = ["Agent", "Region", "agent"]


class Agent(Transfers, Service):
    """The NIXL agent of this process (see the module docstring); made by :func:`agent`."""

    def __init__(self) -> None:
        super().__init__()
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

    def connection_metadata(self) -> bytes:
        """This agent's NIXL metadata, for a peer's ``loadRemoteMD`` (an endpoint's bind)."""
        with self._lock:
            empty = self._b.nixlRegDList(self._b.DRAM_SEG)
            return bytes(self._nixl.getLocalPartialMD(empty, True, self._ucx))

    def new_endpoint_id(self) -> int:
        """A number for a new endpoint, unique in this agent."""
        return next(self._ids)

    def connect(self, endpoint: int, peer: Address, timeout: timedelta) -> None:
        """Load the peer's metadata, say hello, and wait for the peer's hello to ``endpoint``."""
        self._running("connect")
        deadline = time.monotonic() + timeout.total_seconds()
        with self._lock:
            if peer.agent == self.name:
                # Loopback: two endpoints of this process. No metadata to load, no messages.
                state = self._peers.setdefault(peer.agent, Peer())
                if state.live is None:
                    state.live, state.next_exposure = frozenset(), 1
                self._connected.add(peer.agent)
                self._hellos[(peer.agent, peer.endpoint)] = endpoint
                self._changed.notify_all()
                return
            else:
                self._load_remote(
                    "connect",
                    peer.metadata,
                    "the peer's address",
                    "; pass the peer's bind() unchanged",
                )
                self._connected.add(peer.agent)
                state = self._peers.setdefault(peer.agent, Peer())
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
        """Forget ``endpoint``'s peers and signals (its transport closed)."""
        if self._stopping:
            return
        with self._lock:
            for key in [k for k in self._hellos if k[1] == endpoint]:
                del self._hellos[key]
            self._signals.pop(endpoint, None)

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
                self._nixl.genNotif(peer.agent, SIGNAL + str(peer.endpoint).encode("ascii"))
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

    def registered_regions(self) -> int:
        """How many NIXL registrations are live (for tests and the CLI)."""
        with self._lock:
            return len(self._regions)

    def pending_releases(self) -> int:
        """How many releases are queued or waiting for revocation answers."""
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
