"""The memory shared by a kernel and its window's proxy: word indices, opcodes, error codes.

Everything here is a plain ``int``, so the host (``ring``, ``proxy``, ``window``) and the
Triton device functions (``functions``) read the same numbers from one place (#56).

A device window is one block of ``int64`` words, ``STATE_WORDS`` long; its address is the
handle ``get_device_window`` returns. Most words hold the address of an array:

=================  ===================================================================
word               meaning
=================  ===================================================================
``MAGIC``          ``MAGIC_VALUE``: a kernel given some other integer refuses it
``RANK``           this rank; ``NRANKS`` the window's ranks
``SIGNAL_COUNT``   signal ids are ``0 .. SIGNAL_COUNT - 1``; likewise counters, barriers
``RING``           address of the ring: ``CAPACITY`` descriptors of ``DESC_WORDS`` words
``HEAD``           commands reserved by kernels (advanced by compare-and-swap)
``TAIL``           commands the proxy has taken out of the ring (frees their slots)
``DONE``           commands the proxy has completed (``flush_block`` waits on it)
``SIGNALS``        ``int64[SIGNAL_COUNT][NRANKS]``: what each peer has signalled here in
                   total, written by that peer's proxy only (the signal window)
``SIGNAL_BASE``    the same shape: the totals at the last ``reset_signal``
``COUNTERS``       ``int64[COUNTER_COUNT]``: completed local puts, written by the proxy
``COUNTER_BASE``   the totals at the last ``reset_counter``
``BARRIERS``       ``int64[BARRIER_COUNT][NRANKS]``: each peer's latest barrier round
``BARRIER_ROUND``  ``int64[BARRIER_COUNT]``: this rank's rounds (kernels add 1)
``BUFFERS``        ``int64[MAX_BUFFERS][BUFFER_WORDS]``: generation and bytes of each
                   source from ``register_local_buffer``
``PEER_BYTES``     ``int64[NRANKS]``: the bytes of every rank's window
``BASE``           address of this rank's window buffer; ``ELEMENT`` its element size
``TICK``           milliseconds since the proxy started, advanced by the proxy
``TIMEOUT_MS``     how long a wait may last (the communicator's timeout)
``ABORT``          nonzero once the window is aborted (``ABORTED``) or its proxy failed
                   (``PROXY_FAILED``): every wait returns at once
``ERR_*``          the first failure a kernel or the proxy met, for the host's error
``WAITERS``        kernels reading the signal window now: the host tears the window
                   down only once none is (after setting ``ABORT``, which none passes)
=================  ===================================================================

A descriptor is ``DESC_WORDS`` words: the header (opcode in the low byte, the lap bit at
``PHASE_SHIFT``) written last, then ``peer, dst_offset, src_handle, src_offset, bytes,
id, value``. A slot holds a command of lap ``L`` when its lap bit is ``(L + 1) & 1``: zeroed
memory reads as empty in lap 0, and a slot left from lap ``L`` reads as stale in lap ``L+1``.
"""

from __future__ import annotations

#: ``MAGIC`` holds this (ASCII "tcdevwin").
MAGIC_VALUE = 0x7463646576776E

# -- the state block (int64 word indices) ---------------------------------------------
MAGIC = 0
RANK = 1
NRANKS = 2
SIGNAL_COUNT = 3
COUNTER_COUNT = 4
BARRIER_COUNT = 5
RING = 6
CAPACITY = 7
HEAD = 8
TAIL = 9
DONE = 10
SIGNALS = 11
SIGNAL_BASE = 12
COUNTERS = 13
COUNTER_BASE = 14
BARRIERS = 15
BARRIER_ROUND = 16
BUFFERS = 17
PEER_BYTES = 18
BASE = 19
ELEMENT = 20
TICK = 21
TIMEOUT_MS = 22
ABORT = 23
ERR_CODE = 24
ERR_OP = 25
ERR_PEER = 26
ERR_ID = 27
ERR_EXPECTED = 28
ERR_SEEN = 29
MAX_BUFFER_SLOTS = 30
WAITERS = 31
STATE_WORDS = 32

# -- descriptors ----------------------------------------------------------------------
DESC_WORDS = 8
#: Word offsets inside a descriptor.
D_HEADER = 0
D_PEER = 1
D_DST_OFFSET = 2
D_SRC = 3
D_SRC_OFFSET = 4
D_BYTES = 5
D_ID = 6
D_VALUE = 7
OPCODE_MASK = 0xFF
PHASE_SHIFT = 8
#: Commands in flight per window: a kernel finding all of them taken spins until the proxy
#: frees one, and returns ``E_RING_FULL`` (writing nothing) if none frees within the timeout.
RING_SLOTS = 1024

# -- registered source buffers ----------------------------------------------------------
MAX_BUFFERS = 64
BUFFER_WORDS = 2
B_GENERATION = 0
B_BYTES = 1
#: A source handle is ``generation << HANDLE_SHIFT | slot``; generations start at 1, so a
#: handle is never 0 and a handle of a deregistered buffer never matches its reused slot.
HANDLE_SHIFT = 16
HANDLE_SLOT_MASK = (1 << HANDLE_SHIFT) - 1

# -- opcodes: ring commands, and what an error record names ----------------------------
OP_PUT = 1
OP_SIGNAL = 2
OP_BARRIER = 3
OP_WAIT_SIGNAL = 4
OP_WAIT_SIGNAL_FROM = 5
OP_WAIT_COUNTER = 6
OP_FLUSH = 7
OP_BARRIER_WAIT = 8
OP_READ = 9

OP_NAMES = {
    OP_PUT: "put_block",
    OP_SIGNAL: "signal_block",
    OP_BARRIER: "barrier_block",
    OP_WAIT_SIGNAL: "wait_signal",
    OP_WAIT_SIGNAL_FROM: "wait_signal_from",
    OP_WAIT_COUNTER: "wait_counter",
    OP_FLUSH: "flush_block",
    OP_BARRIER_WAIT: "barrier_block",
    OP_READ: "read/reset",
}

# -- ABORT values ---------------------------------------------------------------------
ABORTED = 1
PROXY_FAILED = 2

# -- return codes (0 is success) ---------------------------------------------------------
OK = 0
E_HANDLE = -1
E_RANK = -2
E_SIGNAL_ID = -3
E_COUNTER_ID = -4
E_BARRIER_ID = -5
E_BUFFER = -6
E_RANGE = -7
E_ALIGN = -8
E_TIMEOUT = -9
E_ABORTED = -10
E_RING_FULL = -11
E_PROXY = -12

ERROR_NAMES = {
    E_HANDLE: "E_HANDLE",
    E_RANK: "E_RANK",
    E_SIGNAL_ID: "E_SIGNAL_ID",
    E_COUNTER_ID: "E_COUNTER_ID",
    E_BARRIER_ID: "E_BARRIER_ID",
    E_BUFFER: "E_BUFFER",
    E_RANGE: "E_RANGE",
    E_ALIGN: "E_ALIGN",
    E_TIMEOUT: "E_TIMEOUT",
    E_ABORTED: "E_ABORTED",
    E_RING_FULL: "E_RING_FULL",
    E_PROXY: "E_PROXY",
}


def phase(sequence: int, capacity: int) -> int:
    """The lap bit a descriptor carries when it is command number ``sequence`` (from 0)."""
    return ((sequence // capacity) + 1) & 1


def header(opcode: int, sequence: int, capacity: int) -> int:
    """The header word of command number ``sequence``."""
    return opcode | (phase(sequence, capacity) << PHASE_SHIFT)
