"""The agent's service thread: it polls NIXL's notifications, answers the protocol's
messages (``hello``, ``revoke``, ``flush``; see ``wire``) and finishes the releases of
registrations once every peer answered their revocation.

Imports the plugin's ``base`` and below.
"""

from __future__ import annotations

import os
import threading
import time

from .base import AgentBase
from .records import ACTIVE_S, POLL_IDLE_S, POLL_QUIET_S, Peer, Region, Release
from .wire import POST, SIGNAL, TAG, decode


class Service(AgentBase):
    """What the service thread does (a part of :class:`~torchcomms_nixl.agent.Agent`)."""

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
                self.active_until = now + ACTIVE_S
            if now < self.active_until:
                # Traffic: poll often (a plain sleep is the cheapest wait).
                if busy_pause == 0:
                    os.sched_yield()
                else:
                    time.sleep(busy_pause)
            elif self._connected:
                time.sleep(POLL_QUIET_S)
            else:  # nobody to serve: waiting for work queued here (a release, a connect)
                self._wake.wait(POLL_IDLE_S)
                self._wake.clear()

    def _handle(self, sender: str, message: bytes) -> None:
        if message.startswith((SIGNAL, POST)):
            with self._lock:
                self._take_fast(message)
            return
        if not message.startswith(TAG):
            return
        body = decode(message)
        kind = body.get("t")
        if kind == "hello":
            with self._lock:
                state = self._peers.setdefault(sender, Peer())
                if state.live is None:
                    state.live = frozenset(int(e) for e in body["live"])
                    state.next_exposure = int(body["next"])
                self._hellos[(sender, int(body["to"]))] = int(body["from"])
                self._changed.notify_all()
        elif kind == "revoke":
            ids = [int(e) for e in body["ids"]]
            with self._guard, self._lock:  # no transfer runs while the exposure is revoked
                state = self._peers.setdefault(sender, Peer())
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
            self._releases.append(Release(exposure, region, waiting, deadline, done))
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
