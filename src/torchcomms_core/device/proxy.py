"""The proxy thread of a device window: it drains the command ring in order and carries out
each command with the backend's own window paths (#56).

One thread per window, so commands run in the order kernels reserved them: a put's data
lands before the signal that follows it, and ``fence`` needs no work of its own. A second,
sleeping thread advances ``TICK``, the clock kernels measure their timeouts with, so a wait
ends in time even while the proxy is stuck in a slow or hung command. Whatever stops the
proxy (a failed command, ``abort``, the window closing) sets ``ABORT`` first, so no kernel
waits on a proxy that is gone.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable

from torchcomms_core.device import layout as L
from torchcomms_core.device.ring import Command, CommandRing

#: Seconds the thread keeps polling flat out (yielding the CPU between polls) after its last
#: command, before it naps ``NAP_S`` between polls: a kernel's next command usually follows
#: within microseconds, an idle window should cost next to nothing.
BUSY_S = 0.002
NAP_S = 0.0002
#: Seconds between two advances of ``TICK`` (the resolution of kernels' timeouts).
CLOCK_S = 0.002


class CommandFailed(Exception):
    """A command the proxy refuses or cannot carry out: ``code`` and the peer and id named."""

    def __init__(self, code: int, peer: int, ident: int, message: str) -> None:
        super().__init__(message)
        self.code, self.peer, self.ident = code, peer, ident


def record_failure(
    state: ctypes.Array[ctypes.c_int64],
    code: int,
    opcode: int,
    peer: int,
    ident: int,
    expected: int = 0,
    seen: int = 0,
) -> None:
    """Keep the first failure in the state block's ``ERR_*`` words (the host reads them)."""
    if state[L.ERR_CODE]:
        return
    state[L.ERR_OP], state[L.ERR_PEER], state[L.ERR_ID] = opcode, peer, ident
    state[L.ERR_EXPECTED], state[L.ERR_SEEN] = expected, seen
    state[L.ERR_CODE] = code


class Proxy:
    """Drains ``ring`` on a daemon thread, calling ``perform(command)`` for each command.

    ``perform`` raises :class:`CommandFailed` for a command it refuses, or any exception
    when the backend fails; either stops the proxy with the failure recorded and ``ABORT``
    set, so waiting kernels return ``E_PROXY``.
    """

    def __init__(
        self,
        state: ctypes.Array[ctypes.c_int64],
        ring: CommandRing,
        perform: Callable[[Command], None],
        name: str,
    ) -> None:
        self._state, self._ring, self._perform = state, ring, perform
        self._stop = threading.Event()
        #: The exception that stopped the proxy, for the host's error message.
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"torchcomms-proxy {name}")
        self._thread.daemon = True
        self._clock = Clock(state, name)
        self._thread.start()

    def _run(self) -> None:
        state, ring, perform, stop = self._state, self._ring, self._perform, self._stop
        idle_since = time.monotonic()
        command: Command | None = None
        try:
            while not stop.is_set():
                command = ring.take()
                if command is None:
                    idle = time.monotonic() - idle_since
                    if idle < BUSY_S:
                        os.sched_yield()  # the interpreter lock and the core, briefly
                    else:
                        time.sleep(NAP_S)
                    continue
                try:
                    perform(command)
                except CommandFailed as exc:
                    self.failure = exc
                    record_failure(state, exc.code, command.opcode, exc.peer, exc.ident)
                    break
                ring.complete()
                idle_since = time.monotonic()
        except BaseException as exc:  # the backend failed: every waiting kernel must know
            self.failure = exc
            peer = command.peer if command is not None else -1
            opcode = command.opcode if command is not None else 0
            record_failure(state, L.E_PROXY, opcode, peer, -1)
        finally:
            if not state[L.ABORT]:
                state[L.ABORT] = L.PROXY_FAILED if self.failure is not None else L.ABORTED

    def alive(self) -> bool:
        """Whether the thread still drains the ring."""
        return self._thread.is_alive()

    def abort(self) -> None:
        """Wake every waiting kernel with ``E_ABORTED`` and stop draining (returns at once)."""
        if not self._state[L.ABORT]:
            self._state[L.ABORT] = L.ABORTED
        self._stop.set()

    def stop(self, timeout_s: float) -> None:
        """Stop the thread once the command it is carrying out has finished."""
        self.abort()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        self._clock.stop(timeout_s)


class Clock:
    """A sleeping thread that advances the state block's ``TICK`` every ``CLOCK_S``, so a
    kernel's wait ends in time even while its proxy is stuck in a slow or hung command."""

    def __init__(self, state: ctypes.Array[ctypes.c_int64], name: str) -> None:
        self._state, self._start = state, time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name=f"torchcomms-clock {name}")
        self._thread.daemon = True
        self._thread.start()

    def _tick(self) -> None:
        state, start, stop = self._state, self._start, self._stop
        while not stop.wait(CLOCK_S):
            state[L.TICK] = int((time.monotonic() - start) * 1000)

    def stop(self, timeout_s: float) -> None:
        """Stop advancing ``TICK``."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
