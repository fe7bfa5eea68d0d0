"""The host side of a device window's command ring: the proxy takes commands out of it, and a
host writer can put them in (benchmarks, tests), by the same protocol as a kernel (#56).

The protocol (``layout`` has the words): a writer reserves command number ``h`` by moving
``HEAD`` from ``h`` to ``h + 1`` while ``h - TAIL < CAPACITY``, writes the descriptor's
words, and writes its header last, with the lap bit of ``h``. The proxy reads the slot of
``TAIL``; once its header carries that command's lap bit the descriptor is complete, and the
proxy copies it out and advances ``TAIL``, which frees the slot. ``DONE`` counts commands the
proxy has carried out.
"""

from __future__ import annotations

import ctypes
import time
from typing import NamedTuple

from torchcomms_core.device import layout as L


class Command(NamedTuple):
    """One descriptor as the proxy reads it (``layout``'s descriptor words, in order)."""

    opcode: int
    peer: int
    dst_offset: int
    src: int
    src_offset: int
    nbytes: int
    ident: int
    value: int


def words_at(address: int, count: int) -> ctypes.Array[ctypes.c_int64]:
    """``count`` int64 words at ``address`` as a ctypes array (loads and stores of one word)."""
    return (ctypes.c_int64 * count).from_address(address)


class CommandRing:
    """A window's ring, read and written through the state block at ``state``.

    Args:
        state: the device window's state block (``layout.STATE_WORDS`` words).
    """

    def __init__(self, state: ctypes.Array[ctypes.c_int64]) -> None:
        self._state = state
        self.capacity = int(state[L.CAPACITY])
        self._slots = words_at(int(state[L.RING]), self.capacity * L.DESC_WORDS)

    # -- the proxy's side ----------------------------------------------------------------

    def take(self) -> Command | None:
        """The next command, its slot freed; ``None`` while the next slot is not written yet."""
        state, cap = self._state, self.capacity
        tail = state[L.TAIL]
        at = (tail % cap) * L.DESC_WORDS
        head = self._slots[at]
        if (head >> L.PHASE_SHIFT) & 1 != L.phase(tail, cap) or not head & L.OPCODE_MASK:
            return None
        words = self._slots[at + 1 : at + L.DESC_WORDS]
        state[L.TAIL] = tail + 1  # the slot may be written again by the next lap
        return Command(head & L.OPCODE_MASK, *words)

    def complete(self) -> None:
        """Count one more command carried out (``flush_block`` waits for ``DONE``)."""
        self._state[L.DONE] += 1

    def pending(self) -> int:
        """Commands reserved but not yet carried out."""
        return int(self._state[L.HEAD] - self._state[L.DONE])

    # -- a host writer ----------------------------------------------------------------

    def push(self, command: Command, timeout_s: float) -> int:
        """Write ``command`` as a kernel would; return 0, or ``E_RING_FULL`` (nothing written)
        when no slot frees within ``timeout_s``, or ``E_ABORTED``.

        Reservation is a plain read and write here, so no kernel may write the same ring
        while a host writer does.
        """
        state, cap = self._state, self.capacity
        deadline = 0.0
        while True:
            if state[L.ABORT]:
                return L.E_ABORTED
            h = state[L.HEAD]
            if h - state[L.TAIL] < cap:
                break
            now = time.monotonic()
            if not deadline:
                deadline = now + timeout_s
            elif now > deadline:
                return L.E_RING_FULL
            time.sleep(0)
        state[L.HEAD] = h + 1
        at = (h % cap) * L.DESC_WORDS
        self._slots[at + 1 : at + L.DESC_WORDS] = list(command[1:])
        self._slots[at] = L.header(command.opcode, h, cap)  # published last
        return L.OK
