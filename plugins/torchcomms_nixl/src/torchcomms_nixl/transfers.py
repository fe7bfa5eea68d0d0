"""Transfers between this agent and a peer's exposed memory: ``write``/``read`` (NIXL
transfers, prepared once and reposted from a cache), posted writes carried in a
notification, and ``flush``.

Every check a transfer makes before it runs is here: the key is the connected peer's and
covers the bytes, the peer is alive and still exposes the memory. Imports the plugin's
``base`` and below.
"""

from __future__ import annotations

import ctypes
import os
import time
from datetime import timedelta
from typing import Any

from torchcomms_core.plugin import (
    CommInputError,
    CommOperationError,
    CommStateError,
    CommTimeoutError,
)

from .base import AgentBase
from .keys import Key, decode_key
from .records import ACTIVE_S, HANDLE_CACHE, NAP_S, NUDGE_S, SPIN_S, Peer, Region
from .wire import POST, POST_HEADER


class Transfers(AgentBase):
    """The agent's one-sided transfers (a part of :class:`~torchcomms_nixl.agent.Agent`)."""

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
        self.active_until = now + ACTIVE_S  # our side of the transfer: keep polling too
        if now - self._nudged.get(key.agent, -NUDGE_S) >= NUDGE_S and key.agent != self.name:
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
            (POST, POST_HEADER.pack(key.exposure, remote.ptr), ctypes.string_at(addr, nbytes))
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
                self._load_remote(where, key.metadata, "the remote buffer's registration")
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
            while len(self._handles) > HANDLE_CACHE:
                _k, (old, *_rest) = self._handles.popitem(last=False)
                self._release_handle(old)
            return handle

    def _usable_peer(self, where: str, key: Key) -> Peer:
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
            spin_until = time.monotonic() + SPIN_S
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
                    time.sleep(NAP_S)
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

    def _forget(self, handle: Any) -> None:
        with self._lock:
            for cache_key, value in list(self._handles.items()):
                if value[0] is handle:
                    del self._handles[cache_key]
            self._release_handle(handle)
