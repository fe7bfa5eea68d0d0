"""A window's device side: the state block a kernel's handle points at, the signal window,
the registered source buffers, and the proxy that carries out what kernels queue (#56).

Signals travel through a second window of the same backend (``int64`` words, one per signal
id and source rank, then one per barrier id and source rank): each rank's proxy keeps the
running total of what it has signalled to every peer and writes that total into the peer's
word, which no one else writes, so no remote atomics are needed and a kernel polls plain
memory. Reset is local: the totals at the reset are kept aside and subtracted.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.device import layout as L
from torchcomms_core.device import native_proxy
from torchcomms_core.device.native_proxy import NativeProxy
from torchcomms_core.device.proxy import CommandFailed, Proxy
from torchcomms_core.device.ring import Command, CommandRing, words_at
from torchcomms_core.foundation import errors
from torchcomms_core.spec.window import WindowEngine

#: Seconds ``abort`` gives kernels to leave their waits (they see ``ABORT`` at their next
#: poll, microseconds on a GPU, a few milliseconds under Triton's interpreter).
WAITERS_GONE_S = 5.0
#: The most signals, counters or barriers one device window may have.
MAX_IDS = 1 << 16


def resolve_counts(
    signal_count: int, counter_count: int, barrier_count: int, size: int
) -> tuple[int, int, int]:
    """The three counts of ``get_device_window``, ``-1`` meaning one per rank; checked."""
    counts = []
    for name, value, default in (
        ("signal_count", signal_count, size),
        ("counter_count", counter_count, size),
        ("barrier_count", barrier_count, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.CommTypeError(f"get_device_window: {name} must be an int, got {value!r}")
        if value == -1:
            value = default
        if not 0 <= value <= MAX_IDS:
            raise errors.CommInputError(
                f"get_device_window: {name}={value} is out of range; pass -1 (one per rank) "
                f"or 0..{MAX_IDS}"
            )
        counts.append(value)
    return counts[0], counts[1], counts[2]


class DeviceWindow:
    """The device side of one registered window (collective to build and to close).

    Args:
        name: how errors name the window (``"<comm>/window<k>"``).
        rank, size: this rank and the window's ranks.
        data: the window's engine (puts go through it).
        signals: a fresh engine of the same backend for the signal words.
        dtype: the window's element type; ``peer_bytes``: every rank's window in bytes;
        base: the address of this rank's window buffer.
        counts: ``(signal_count, counter_count, barrier_count)`` from :func:`resolve_counts`.
        timeout: how long a kernel's wait, and a proxy's call, may last.
    """

    def __init__(
        self,
        name: str,
        rank: int,
        size: int,
        data: WindowEngine,
        signals: WindowEngine,
        dtype: torch.dtype,
        peer_bytes: list[int],
        base: int,
        counts: tuple[int, int, int],
        timeout: timedelta,
    ) -> None:
        self.name, self.rank, self.size = name, rank, size
        self.counts = counts
        self._data, self._signals = data, signals
        self._dtype = dtype
        self._element = torch.empty((), dtype=dtype).element_size()
        self._peer_bytes = list(peer_bytes)
        self._timeout = timeout
        n_signal, n_counter, n_barrier = counts
        self._barrier_at = n_signal * size
        # The signal window: registering it is collective, like the window itself.
        self._signal_words = torch.zeros(max(1, (n_signal + n_barrier) * size), dtype=torch.int64)
        signals.register(self._signal_words)
        self._one = torch.zeros(1, dtype=torch.int64)
        self._one_word = words_at(self._one.data_ptr(), 1)
        # Local memory: the state block, the ring, bases, counters, buffer table.
        state = torch.zeros(L.STATE_WORDS, dtype=torch.int64)
        ring = torch.zeros(L.RING_SLOTS * L.DESC_WORDS, dtype=torch.int64)
        local = torch.zeros(
            n_signal * size + 2 * n_counter + n_barrier + L.MAX_BUFFERS * L.BUFFER_WORDS + size,
            dtype=torch.int64,
        )
        self._memory = (state, ring, local)  # kept alive as long as kernels may read them
        at = local.data_ptr()
        regions = {}
        for key, words in (
            (L.SIGNAL_BASE, n_signal * size),
            (L.COUNTERS, n_counter),
            (L.COUNTER_BASE, n_counter),
            (L.BARRIER_ROUND, n_barrier),
            (L.BUFFERS, L.MAX_BUFFERS * L.BUFFER_WORDS),
            (L.PEER_BYTES, size),
        ):
            regions[key] = at
            at += words * 8
        self._state = words_at(state.data_ptr(), L.STATE_WORDS)
        s = self._state
        s[L.RANK], s[L.NRANKS] = rank, size
        s[L.SIGNAL_COUNT], s[L.COUNTER_COUNT], s[L.BARRIER_COUNT] = counts
        s[L.RING], s[L.CAPACITY] = ring.data_ptr(), L.RING_SLOTS
        signal_base = self._signal_words.data_ptr()  # where the signal engine put them
        s[L.SIGNALS] = signal_base
        s[L.BARRIERS] = signal_base + self._barrier_at * 8
        for key, address in regions.items():
            s[key] = address
        s[L.BASE], s[L.ELEMENT] = base, self._element
        s[L.TIMEOUT_MS] = max(1, int(timeout.total_seconds() * 1000))
        s[L.MAX_BUFFER_SLOTS] = L.MAX_BUFFERS
        peers = words_at(regions[L.PEER_BYTES], size)
        for r, nbytes in enumerate(peer_bytes):
            peers[r] = nbytes
        self._counters = words_at(regions[L.COUNTERS], max(1, n_counter))
        self._buffers = words_at(regions[L.BUFFERS], L.MAX_BUFFERS * L.BUFFER_WORDS)
        self._sources: dict[int, torch.Tensor] = {}
        self._generations = [0] * L.MAX_BUFFERS
        self._sent = [[0] * n_signal for _ in range(size)]
        self._lock = threading.Lock()
        # Where a registered source is, for the C proxy (the Python one keeps the tensors).
        self._source_at = torch.zeros(L.MAX_BUFFERS, dtype=torch.int64)
        s[L.MAGIC] = L.MAGIC_VALUE  # usable from here on
        self.ring = CommandRing(s)
        self._proxy: Proxy | NativeProxy = self._start_proxy(name)
        self.handle = state.data_ptr()
        self._closed = False

    def _start_proxy(self, name: str) -> Proxy | NativeProxy:
        """The C proxy where every peer's window and signal words are mapped here and it
        builds; else the Python proxy."""
        lib = native_proxy.library()
        if lib is not None:
            data = native_proxy.mapped_peers(self._data, self.size)
            signals = native_proxy.mapped_peers(self._signals, self.size)
            if data is not None and signals is not None:
                sent = torch.zeros(max(1, self.size * self.counts[0]), dtype=torch.int64)
                return NativeProxy(
                    lib,
                    self._state,
                    data,
                    signals,
                    self._source_at,
                    sent,
                    self._barrier_at,
                    name,
                    self._memory,
                )
        return Proxy(self._state, self.ring, self._perform, name)

    @property
    def proxy_kind(self) -> str:
        """``"native"`` (the C thread) or ``"python"``: which proxy drains the ring."""
        return "native" if isinstance(self._proxy, NativeProxy) else "python"

    # -- source buffers --------------------------------------------------------------------

    def register_buffer(self, tensor: torch.Tensor) -> int:
        """A source handle for ``tensor`` (contiguous, on the CPU); not collective."""
        where = "register_local_buffer"
        if not isinstance(tensor, torch.Tensor):
            raise errors.CommTypeError(
                f"{where}: tensor must be a torch.Tensor, got {type(tensor)}"
            )
        if not tensor.is_contiguous():
            raise errors.CommInputError(
                f"{where}: the tensor must be contiguous; pass .contiguous()"
            )
        if tensor.device.type != "cpu":
            raise errors.CommInputError(
                f"{where}: the tensor is on {tensor.device}, but the core proxy reads sources "
                f"on the CPU (the window's device); register a CPU tensor"
            )
        with self._lock:
            free = [i for i in range(L.MAX_BUFFERS) if i not in self._sources]
            if not free:
                raise errors.CommStateError(
                    f"{where}: all {L.MAX_BUFFERS} source slots of window {self.name} are in "
                    f"use; deregister_local_buffer() one first"
                )
            slot = free[0]
            generation = self._generations[slot] = self._generations[slot] + 1
            flat = tensor.view(-1).view(torch.uint8) if tensor.numel() else tensor.new_empty(0)
            self._sources[slot] = flat.view(torch.uint8)
            self._source_at[slot] = tensor.data_ptr()
            self._buffers[slot * L.BUFFER_WORDS + L.B_BYTES] = (
                tensor.numel() * tensor.element_size()
            )
            self._buffers[slot * L.BUFFER_WORDS + L.B_GENERATION] = generation
        return (generation << L.HANDLE_SHIFT) | slot

    def deregister_buffer(self, handle: int) -> None:
        """Forget a source handle once the commands already queued have been carried out."""
        slot = self._slot(handle)
        if slot is None:
            raise errors.CommInputError(
                f"deregister_local_buffer: {handle!r} is not a registered buffer of window "
                f"{self.name}"
            )
        self.flush()
        with self._lock:
            self._buffers[slot * L.BUFFER_WORDS + L.B_GENERATION] = 0
            del self._sources[slot]

    def _slot(self, handle: Any) -> int | None:
        if isinstance(handle, bool) or not isinstance(handle, int) or handle <= 0:
            return None
        slot, generation = handle & L.HANDLE_SLOT_MASK, handle >> L.HANDLE_SHIFT
        if slot >= L.MAX_BUFFERS or slot not in self._sources:
            return None
        return slot if self._generations[slot] == generation else None

    # -- the proxy's work ----------------------------------------------------------------

    def _perform(self, c: Command) -> None:
        if not 0 <= c.peer < self.size:
            raise CommandFailed(L.E_RANK, c.peer, c.ident, f"peer {c.peer} is out of range")
        if c.opcode == L.OP_PUT:
            # Every id is checked before anything is written.
            if c.ident >= self.counts[0]:
                raise CommandFailed(L.E_SIGNAL_ID, c.peer, c.ident, "unknown signal")
            if c.value >= self.counts[1]:
                raise CommandFailed(L.E_COUNTER_ID, c.peer, c.value, "unknown counter")
            if c.nbytes:
                self._put(c)
            if c.ident >= 0:
                self._signal(c.peer, c.ident, 1)
            if c.value >= 0:  # the source may be reused: the put above has returned
                self._counters[c.value] += 1
        elif c.opcode == L.OP_SIGNAL:
            self._signal(c.peer, c.ident, c.value)
        elif c.opcode == L.OP_BARRIER:
            if not 0 <= c.ident < self.counts[2]:
                raise CommandFailed(L.E_BARRIER_ID, c.peer, c.ident, "unknown barrier")
            self._one_word[0] = c.value
            at = self._barrier_at + c.ident * self.size + self.rank
            for peer in range(self.size):
                self._signals.put(self._one, peer, at, False, self._timeout)
        else:
            raise CommandFailed(L.E_HANDLE, c.peer, c.opcode, f"unknown opcode {c.opcode}")

    def _put(self, c: Command) -> None:
        slot = self._slot(c.src)
        if slot is None:
            raise CommandFailed(L.E_BUFFER, c.peer, c.src, "unregistered source")
        source, e = self._sources[slot], self._element
        if (c.dst_offset | c.src_offset | c.nbytes) % e:
            raise CommandFailed(L.E_ALIGN, c.peer, -1, "misaligned")
        if (
            min(c.dst_offset, c.src_offset, c.nbytes) < 0
            or c.dst_offset + c.nbytes > self._peer_bytes[c.peer]
            or c.src_offset + c.nbytes > source.numel()
        ):
            raise CommandFailed(L.E_RANGE, c.peer, -1, "out of range")
        chunk = source[c.src_offset : c.src_offset + c.nbytes].view(self._dtype)
        self._data.put(chunk, c.peer, c.dst_offset // e, False, self._timeout)

    def _signal(self, peer: int, ident: int, value: int) -> None:
        if not 0 <= ident < self.counts[0]:
            raise CommandFailed(L.E_SIGNAL_ID, peer, ident, "unknown signal")
        total = self._sent[peer][ident] = self._sent[peer][ident] + value
        self._one_word[0] = total
        self._signals.put(self._one, peer, ident * self.size + self.rank, False, self._timeout)

    # -- host-side views -------------------------------------------------------------------

    def word(self, index: int) -> int:
        """One word of the state block (``layout``'s indices)."""
        return int(self._state[index])

    def flush(self) -> None:
        """Wait until the proxy has carried out every command queued so far."""
        deadline = time.monotonic() + self._timeout.total_seconds()
        while self._state[L.DONE] < self._state[L.HEAD] and not self._state[L.ABORT]:
            if time.monotonic() > deadline:
                raise errors.CommTimeoutError(
                    f"device window {self.name}: {self.ring.pending()} command(s) still queued "
                    f"after {self._timeout.total_seconds():g} s"
                )
            time.sleep(0.0002)

    def failure(self) -> errors.TorchCommError | None:
        """The first failure a kernel or the proxy recorded, as the error to raise."""
        s = self._state
        code = int(s[L.ERR_CODE])
        if not code:
            return None
        op = L.OP_NAMES.get(int(s[L.ERR_OP]), f"opcode {int(s[L.ERR_OP])}")
        peer, ident = int(s[L.ERR_PEER]), int(s[L.ERR_ID])
        expected, seen = int(s[L.ERR_EXPECTED]), int(s[L.ERR_SEEN])
        name = L.ERROR_NAMES.get(code, str(code))
        head = f"device window {self.name} (rank {self.rank}): {op} returned {name} ({code})"
        what = _awaited(op, peer, ident)
        seconds = self._timeout.total_seconds()
        if code == L.E_TIMEOUT:
            return errors.CommTimeoutError(
                f"{head}: {what} did not reach {expected} within {seconds:g} s (it was {seen}); "
                f"the peer never signalled, or it died"
            )
        if code == L.E_ABORTED:
            return errors.CommStateError(f"{head}: the window was aborted while waiting for {what}")
        if code == L.E_RING_FULL:
            return errors.CommTimeoutError(
                f"{head}: the command ring stayed full ({L.RING_SLOTS} commands in flight) for "
                f"{seconds:g} s; nothing was queued"
            )
        if code == L.E_PROXY:
            cause = self._proxy.failure
            return errors.CommOperationError(
                f"{head}: the proxy failed carrying out a command for peer {peer}: {cause!r}"
            )
        return errors.CommInputError(f"{head}: {_refusal(code, peer, ident, expected, seen, self)}")

    def clear_failure(self) -> None:
        """Forget the recorded failure (after the host has reported it)."""
        self._state[L.ERR_CODE] = 0

    # -- ending ------------------------------------------------------------------------------

    def abort(self) -> None:
        """Wake every waiting kernel with ``E_ABORTED``, stop the proxy (once the command it
        is carrying out has finished), and return once no kernel reads the signal window."""
        self._proxy.stop(self._timeout.total_seconds())
        deadline = time.monotonic() + min(self._timeout.total_seconds(), WAITERS_GONE_S)
        while self._state[L.WAITERS] > 0 and time.monotonic() < deadline:
            time.sleep(0.0005)

    def close(self, collective: bool) -> None:
        """Stop the proxy and release the signal window (collective unless tearing down).

        The handle is invalid afterwards: its memory goes with this object.
        """
        if self._closed:
            return
        self._closed = True
        try:
            if collective and not self._state[L.ABORT]:
                self.flush()
        except BaseException:
            collective = False  # the peers cannot be met in order: release alone
            raise
        finally:
            self.abort()
            self._sources.clear()
            if collective:
                self._signals.deregister()
            else:
                self._signals.free(abort=True)


def _awaited(op: str, peer: int, ident: int) -> str:
    if op == "wait_counter":
        return f"counter {ident}"
    if op == "flush_block":
        return "the queued commands"
    if op == "barrier_block":
        return f"barrier {ident} from peer {peer}"
    if peer < 0:
        return f"signal {ident} (summed over every peer)"
    return f"signal {ident} from peer {peer}"


def _refusal(code: int, peer: int, ident: int, end: int, limit: int, w: DeviceWindow) -> str:
    n_signal, n_counter, n_barrier = w.counts
    if code == L.E_RANK:
        return f"peer {peer} is out of range for {w.size} ranks; nothing was queued"
    if code == L.E_SIGNAL_ID:
        return f"signal id {ident} is not in 0..{n_signal - 1}; nothing was queued"
    if code == L.E_COUNTER_ID:
        return f"counter id {ident} is not in 0..{n_counter - 1}; nothing was queued"
    if code == L.E_BARRIER_ID:
        return f"barrier id {ident} is not in 0..{n_barrier - 1}; nothing was queued"
    if code == L.E_BUFFER:
        return (
            f"source handle {ident:#x} is not a registered buffer (register_local_buffer, "
            f"not yet deregistered); nothing was queued"
        )
    if code == L.E_RANGE:
        return (
            f"the put to peer {peer} reaches byte {end}, past the {limit} bytes of the peer's "
            f"window or of the source; nothing was queued"
        )
    if code == L.E_ALIGN:
        return (
            f"offsets and sizes must be multiples of the window's element size "
            f"({w._element} bytes); nothing was queued"
        )
    return f"error {code}"
