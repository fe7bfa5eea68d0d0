"""The device functions a Triton kernel calls on a device window (the reference's names and
argument orders, ``torchcomms.triton``), written in Triton itself (#56).

Each function takes the handle from ``window.get_device_window()`` as ``win`` and returns
0 on success or a negative code (``layout.E_*``); ``read_signal`` and ``read_counter``
return the value, or a negative code for an unknown id. Arguments are checked before anything
is written: a refused call queues nothing and records why, for the host's error. Offsets and
sizes are in bytes. A call is made once per program (the ``_block`` functions are
block-wide, as in the reference: every thread of the program takes part in the one call).

Puts and signals are queued on the window's ring (see ``ring``) for its proxy; waits poll
memory the proxy or the peers' proxies write. A wait gives up with ``E_TIMEOUT`` after the
communicator's timeout, measured on the proxy's clock (``TICK``), and with ``E_ABORTED`` or
``E_PROXY`` as soon as the window is aborted or its proxy has failed.

Importing this module needs triton (``pip install torchcomms-core[triton]``).
"""

from __future__ import annotations

from torchcomms_core.device import layout as L

try:
    import triton
    import triton.language as tl
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the environment
    raise ModuleNotFoundError(
        "torchcomms.triton needs triton, which is not installed here: "
        "pip install 'torchcomms-core[triton]' (torch's CUDA builds ship it)",
        name=exc.name,
    ) from exc

__all__ = [
    "barrier_block",
    "base",
    "fence",
    "flush_block",
    "num_ranks",
    "put_block",
    "rank",
    "read_counter",
    "read_signal",
    "reset_counter",
    "reset_signal",
    "self_copy_block",
    "signal_block",
    "size",
    "wait_counter",
    "wait_signal",
    "wait_signal_from",
]

# Triton reads module globals inside a kernel only as constexpr values.
_MAGIC = tl.constexpr(L.MAGIC_VALUE)
_W_MAGIC = tl.constexpr(L.MAGIC)
_W_RANK = tl.constexpr(L.RANK)
_W_NRANKS = tl.constexpr(L.NRANKS)
_W_SIGNAL_COUNT = tl.constexpr(L.SIGNAL_COUNT)
_W_COUNTER_COUNT = tl.constexpr(L.COUNTER_COUNT)
_W_BARRIER_COUNT = tl.constexpr(L.BARRIER_COUNT)
_W_RING = tl.constexpr(L.RING)
_W_CAPACITY = tl.constexpr(L.CAPACITY)
_W_HEAD = tl.constexpr(L.HEAD)
_W_TAIL = tl.constexpr(L.TAIL)
_W_DONE = tl.constexpr(L.DONE)
_W_SIGNALS = tl.constexpr(L.SIGNALS)
_W_SIGNAL_BASE = tl.constexpr(L.SIGNAL_BASE)
_W_COUNTERS = tl.constexpr(L.COUNTERS)
_W_COUNTER_BASE = tl.constexpr(L.COUNTER_BASE)
_W_BARRIERS = tl.constexpr(L.BARRIERS)
_W_BARRIER_ROUND = tl.constexpr(L.BARRIER_ROUND)
_W_BUFFERS = tl.constexpr(L.BUFFERS)
_W_PEER_BYTES = tl.constexpr(L.PEER_BYTES)
_W_BASE = tl.constexpr(L.BASE)
_W_ELEMENT = tl.constexpr(L.ELEMENT)
_W_TICK = tl.constexpr(L.TICK)
_W_TIMEOUT_MS = tl.constexpr(L.TIMEOUT_MS)
_W_ABORT = tl.constexpr(L.ABORT)
_W_ERR_CODE = tl.constexpr(L.ERR_CODE)
_W_ERR_OP = tl.constexpr(L.ERR_OP)
_W_ERR_PEER = tl.constexpr(L.ERR_PEER)
_W_ERR_ID = tl.constexpr(L.ERR_ID)
_W_ERR_EXPECTED = tl.constexpr(L.ERR_EXPECTED)
_W_ERR_SEEN = tl.constexpr(L.ERR_SEEN)
_W_WAITERS = tl.constexpr(L.WAITERS)
_DESC_WORDS = tl.constexpr(L.DESC_WORDS)
_PHASE_SHIFT = tl.constexpr(L.PHASE_SHIFT)
_MAX_BUFFERS = tl.constexpr(L.MAX_BUFFERS)
_BUFFER_WORDS = tl.constexpr(L.BUFFER_WORDS)
_B_GENERATION = tl.constexpr(L.B_GENERATION)
_B_BYTES = tl.constexpr(L.B_BYTES)
_HANDLE_SHIFT = tl.constexpr(L.HANDLE_SHIFT)
_HANDLE_SLOT_MASK = tl.constexpr(L.HANDLE_SLOT_MASK)
_ABORTED = tl.constexpr(L.ABORTED)
_OP_PUT = tl.constexpr(L.OP_PUT)
_OP_SIGNAL = tl.constexpr(L.OP_SIGNAL)
_OP_BARRIER = tl.constexpr(L.OP_BARRIER)
_OP_WAIT_SIGNAL = tl.constexpr(L.OP_WAIT_SIGNAL)
_OP_WAIT_SIGNAL_FROM = tl.constexpr(L.OP_WAIT_SIGNAL_FROM)
_OP_WAIT_COUNTER = tl.constexpr(L.OP_WAIT_COUNTER)
_OP_FLUSH = tl.constexpr(L.OP_FLUSH)
_OP_BARRIER_WAIT = tl.constexpr(L.OP_BARRIER_WAIT)
_OP_READ = tl.constexpr(L.OP_READ)
_E_HANDLE = tl.constexpr(L.E_HANDLE)
_E_RANK = tl.constexpr(L.E_RANK)
_E_SIGNAL_ID = tl.constexpr(L.E_SIGNAL_ID)
_E_COUNTER_ID = tl.constexpr(L.E_COUNTER_ID)
_E_BARRIER_ID = tl.constexpr(L.E_BARRIER_ID)
_E_BUFFER = tl.constexpr(L.E_BUFFER)
_E_RANGE = tl.constexpr(L.E_RANGE)
_E_ALIGN = tl.constexpr(L.E_ALIGN)
_E_TIMEOUT = tl.constexpr(L.E_TIMEOUT)
_E_ABORTED = tl.constexpr(L.E_ABORTED)
_E_RING_FULL = tl.constexpr(L.E_RING_FULL)
_E_PROXY = tl.constexpr(L.E_PROXY)

# What a wait polls (``_observe``).
_SIGNAL_FROM = tl.constexpr(0)
_SIGNAL_TOTAL = tl.constexpr(1)
_COUNTER = tl.constexpr(2)
_DONE = tl.constexpr(3)
_BARRIER = tl.constexpr(4)

# -- helpers -------------------------------------------------------------------------------


@triton.jit
def _i64(x):
    return tl.cast(x, tl.int64)


@triton.jit
def _words(win):
    return _i64(win).to(tl.pointer_type(tl.int64))


@triton.jit
def _array(w, word):
    return tl.load(w + word).to(tl.pointer_type(tl.int64))


@triton.jit
def _check_handle(win):
    """0 for a device window's handle, ``E_HANDLE`` for 0 or any other block of memory."""
    rc = tl.cast(_E_HANDLE, tl.int32)
    if _i64(win) != 0:
        magic = tl.load(_words(win) + _W_MAGIC)
        rc = tl.where(magic == _MAGIC, 0, rc)
    return rc


@triton.jit
def _stopped(w):
    """0 while the window runs; ``E_ABORTED`` or ``E_PROXY`` once it stopped."""
    flag = tl.load(w + _W_ABORT, volatile=True)
    rc = tl.where(flag == 0, 0, tl.where(flag == _ABORTED, _E_ABORTED, _E_PROXY))
    return rc.to(tl.int32)


@triton.jit
def _record(w, code, op, peer, ident, expected, seen):
    """Keep the first failure for the host (the proxy keeps its own the same way)."""
    old = tl.atomic_cas(w + _W_ERR_CODE, _i64(0), _i64(code))
    if old == 0:
        tl.store(w + _W_ERR_OP, _i64(op))
        tl.store(w + _W_ERR_PEER, _i64(peer))
        tl.store(w + _W_ERR_ID, _i64(ident))
        tl.store(w + _W_ERR_EXPECTED, _i64(expected))
        tl.store(w + _W_ERR_SEEN, _i64(seen))


@triton.jit
def _observe(w, what: tl.constexpr, peer, ident, target):
    """The value a wait compares with its target."""
    n = tl.load(w + _W_NRANKS)
    if what == _SIGNAL_FROM:
        at = _i64(ident) * n + peer
        value = tl.load(_array(w, _W_SIGNALS) + at, volatile=True) - tl.load(
            _array(w, _W_SIGNAL_BASE) + at, volatile=True
        )
    elif what == _SIGNAL_TOTAL:
        sig = _array(w, _W_SIGNALS) + _i64(ident) * n
        bas = _array(w, _W_SIGNAL_BASE) + _i64(ident) * n
        value = tl.full((), 0, tl.int64)
        for p in range(0, n):
            value += tl.load(sig + p, volatile=True) - tl.load(bas + p, volatile=True)
    elif what == _COUNTER:
        value = tl.load(_array(w, _W_COUNTERS) + ident, volatile=True) - tl.load(
            _array(w, _W_COUNTER_BASE) + ident, volatile=True
        )
    elif what == _DONE:
        value = tl.load(w + _W_DONE, volatile=True)
    else:  # _BARRIER: the least round any peer has reached
        rounds = _array(w, _W_BARRIERS) + _i64(ident) * n
        value = tl.load(rounds, volatile=True)
        for p in range(1, n):
            value = tl.minimum(value, tl.load(rounds + p, volatile=True))
    return value


@triton.jit
def _wait(w, what: tl.constexpr, op, peer, ident, expected):
    """Poll until the observed value reaches ``expected``; a timeout or a stop ends it."""
    expected = _i64(expected)
    start = tl.load(w + _W_TICK, volatile=True)
    limit = tl.load(w + _W_TIMEOUT_MS)
    # Announce the reads first, then look at ABORT: a host that set ABORT and then saw no
    # waiter may unmap the signal window, and this wait will not read it.
    tl.atomic_add(w + _W_WAITERS, _i64(1))
    rc = _stopped(w)
    seen = tl.full((), 0, tl.int64)
    if rc == 0:
        seen = _observe(w, what, peer, ident, expected)
    while (seen < expected) & (rc == 0):
        rc = _stopped(w)
        if rc == 0:
            if tl.load(w + _W_TICK, volatile=True) - start > limit:
                rc = tl.cast(_E_TIMEOUT, tl.int32)
            else:
                seen = _observe(w, what, peer, ident, expected)
    tl.atomic_add(w + _W_WAITERS, _i64(-1))
    if rc != 0:
        _record(w, rc, op, peer, ident, expected, seen)
    return rc


@triton.jit
def _push(w, op, peer, dst_offset, src, src_offset, nbytes, ident, value):
    """Queue one command on the ring; ``E_RING_FULL`` (nothing written) if no slot frees."""
    rc = _stopped(w)
    if rc == 0:
        ring = _array(w, _W_RING)
        cap = tl.load(w + _W_CAPACITY)
        start = tl.load(w + _W_TICK, volatile=True)
        limit = tl.load(w + _W_TIMEOUT_MS)
        h = tl.load(w + _W_HEAD, volatile=True)
        got = tl.cast(0, tl.int32)
        while (got == 0) & (rc == 0):
            if h - tl.load(w + _W_TAIL, volatile=True) < cap:
                old = tl.atomic_cas(w + _W_HEAD, h, h + 1)
                if old == h:
                    got = tl.cast(1, tl.int32)
                else:
                    h = old
            else:
                rc = _stopped(w)
                if rc == 0:
                    if tl.load(w + _W_TICK, volatile=True) - start > limit:
                        rc = tl.cast(_E_RING_FULL, tl.int32)
                    else:
                        h = tl.load(w + _W_HEAD, volatile=True)
        if got == 1:
            slot = ring + (h % cap) * _DESC_WORDS
            tl.store(slot + 1, _i64(peer))
            tl.store(slot + 2, _i64(dst_offset))
            tl.store(slot + 3, _i64(src))
            tl.store(slot + 4, _i64(src_offset))
            tl.store(slot + 5, _i64(nbytes))
            tl.store(slot + 6, _i64(ident))
            tl.store(slot + 7, _i64(value))
            lap = ((h // cap) + 1) % 2
            # The header goes last, with release order: the proxy reads a whole descriptor.
            tl.atomic_xchg(slot, _i64(op) + (lap << _PHASE_SHIFT), sem="release", scope="sys")
        else:
            _record(w, rc, op, peer, ident, 0, 0)
    return rc


@triton.jit
def _id_ok(w, count_word, ident):
    return (_i64(ident) >= 0) & (_i64(ident) < tl.load(w + count_word))


# -- puts and signals ------------------------------------------------------------------------


@triton.jit
def put_block(win, dst_offset, src_buf, src_offset, dst_rank, bytes, signal_id, counter_id):
    """Copy ``bytes`` from the registered source ``src_buf`` at ``src_offset`` into
    ``dst_rank``'s window at ``dst_offset``; then add 1 to signal ``signal_id`` from this rank
    at the target, and 1 to local counter ``counter_id`` once the source may be reused (an id
    below 0: none). Returns 0 once queued, or a negative code (nothing queued)."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        dst_offset, src_offset, nbytes = _i64(dst_offset), _i64(src_offset), _i64(bytes)
        src, peer = _i64(src_buf), _i64(dst_rank)
        n = tl.load(w + _W_NRANKS)
        peer_ok = (peer >= 0) & (peer < n)
        window_bytes = tl.load(_array(w, _W_PEER_BYTES) + tl.where(peer_ok, peer, 0))
        slot = src & _HANDLE_SLOT_MASK
        slot_ok = (src > 0) & (slot < _MAX_BUFFERS)
        entry = _array(w, _W_BUFFERS) + tl.where(slot_ok, slot, 0) * _BUFFER_WORDS
        generation = tl.load(entry + _B_GENERATION, volatile=True)
        source_bytes = tl.load(entry + _B_BYTES, volatile=True)
        buffer_ok = slot_ok & (generation > 0) & ((src >> _HANDLE_SHIFT) == generation)
        element = tl.load(w + _W_ELEMENT)
        aligned = ((dst_offset % element) == 0) & ((src_offset % element) == 0)
        aligned = aligned & ((nbytes % element) == 0)
        dst_fits = (dst_offset >= 0) & (nbytes >= 0) & (dst_offset + nbytes <= window_bytes)
        src_fits = (src_offset >= 0) & (src_offset + nbytes <= source_bytes)
        signal_ok = (_i64(signal_id) < 0) | _id_ok(w, _W_SIGNAL_COUNT, signal_id)
        counter_ok = (_i64(counter_id) < 0) | _id_ok(w, _W_COUNTER_COUNT, counter_id)
        code = tl.where(dst_fits & src_fits, 0, _E_RANGE)
        code = tl.where(aligned, code, _E_ALIGN)
        code = tl.where(buffer_ok, code, _E_BUFFER)
        code = tl.where(counter_ok, code, _E_COUNTER_ID)
        code = tl.where(signal_ok, code, _E_SIGNAL_ID)
        code = tl.where(peer_ok, code, _E_RANK).to(tl.int32)
        if code == 0:
            rc = _push(w, _OP_PUT, peer, dst_offset, src, src_offset, nbytes, signal_id, counter_id)
        else:
            ident = tl.where(code == _E_COUNTER_ID, _i64(counter_id), _i64(signal_id))
            ident = tl.where(code == _E_BUFFER, src, ident)
            end = tl.where(dst_fits, src_offset + nbytes, dst_offset + nbytes)
            bound = tl.where(dst_fits, source_bytes, window_bytes)
            _record(w, code, _OP_PUT, peer, ident, end, bound)
            rc = code
    return rc


@triton.jit
def signal_block(win, peer, signal_id, value):
    """Add ``value`` to ``peer``'s signal ``signal_id`` from this rank, after every put this
    window queued before. Returns 0 once queued, or a negative code."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        n = tl.load(w + _W_NRANKS)
        code = tl.where(_id_ok(w, _W_SIGNAL_COUNT, signal_id), 0, _E_SIGNAL_ID)
        code = tl.where((_i64(peer) >= 0) & (_i64(peer) < n), code, _E_RANK).to(tl.int32)
        if code == 0:
            rc = _push(w, _OP_SIGNAL, peer, 0, 0, 0, 0, signal_id, value)
        else:
            _record(w, code, _OP_SIGNAL, peer, signal_id, 0, 0)
            rc = code
    return rc


# -- waits ---------------------------------------------------------------------------------


@triton.jit
def wait_signal_from(win, peer, signal_id, expected):
    """Wait until signal ``signal_id`` from ``peer`` is at least ``expected``."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        n = tl.load(w + _W_NRANKS)
        code = tl.where(_id_ok(w, _W_SIGNAL_COUNT, signal_id), 0, _E_SIGNAL_ID)
        code = tl.where((_i64(peer) >= 0) & (_i64(peer) < n), code, _E_RANK).to(tl.int32)
        if code == 0:
            rc = _wait(w, _SIGNAL_FROM, _OP_WAIT_SIGNAL_FROM, peer, signal_id, expected)
        else:
            _record(w, code, _OP_WAIT_SIGNAL_FROM, peer, signal_id, expected, 0)
            rc = code
    return rc


@triton.jit
def wait_signal(win, signal_id, expected):
    """Wait until signal ``signal_id``, summed over every peer, is at least ``expected``."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        if _id_ok(w, _W_SIGNAL_COUNT, signal_id):
            rc = _wait(w, _SIGNAL_TOTAL, _OP_WAIT_SIGNAL, -1, signal_id, expected)
        else:
            _record(w, _E_SIGNAL_ID, _OP_WAIT_SIGNAL, -1, signal_id, expected, 0)
            rc = tl.cast(_E_SIGNAL_ID, tl.int32)
    return rc


@triton.jit
def wait_counter(win, counter_id, expected):
    """Wait until local counter ``counter_id`` is at least ``expected``."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        if _id_ok(w, _W_COUNTER_COUNT, counter_id):
            rc = _wait(w, _COUNTER, _OP_WAIT_COUNTER, -1, counter_id, expected)
        else:
            _record(w, _E_COUNTER_ID, _OP_WAIT_COUNTER, -1, counter_id, expected, 0)
            rc = tl.cast(_E_COUNTER_ID, tl.int32)
    return rc


# -- reading and resetting -----------------------------------------------------------------


@triton.jit
def read_signal(win, signal_id):
    """Signal ``signal_id`` summed over every peer since its last reset (negative: bad id)."""
    value = tl.cast(_check_handle(win), tl.int64)
    if value == 0:
        w = _words(win)
        if _id_ok(w, _W_SIGNAL_COUNT, signal_id):
            tl.atomic_add(w + _W_WAITERS, _i64(1))
            value = _stopped(w).to(tl.int64)
            if value == 0:
                value = _observe(w, _SIGNAL_TOTAL, 0, signal_id, 0)
            tl.atomic_add(w + _W_WAITERS, _i64(-1))
        else:
            value = tl.cast(_E_SIGNAL_ID, tl.int64)
    return value


@triton.jit
def reset_signal(win, signal_id):
    """Set signal ``signal_id`` back to 0 for every peer (call it when none is in flight)."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        if _id_ok(w, _W_SIGNAL_COUNT, signal_id):
            tl.atomic_add(w + _W_WAITERS, _i64(1))
            rc = _stopped(w)
            if rc == 0:
                n = tl.load(w + _W_NRANKS)
                sig = _array(w, _W_SIGNALS) + _i64(signal_id) * n
                bas = _array(w, _W_SIGNAL_BASE) + _i64(signal_id) * n
                for p in range(0, n):
                    tl.store(bas + p, tl.load(sig + p, volatile=True))
            tl.atomic_add(w + _W_WAITERS, _i64(-1))
        else:
            _record(w, _E_SIGNAL_ID, _OP_READ, -1, signal_id, 0, 0)
            rc = tl.cast(_E_SIGNAL_ID, tl.int32)
    return rc


@triton.jit
def read_counter(win, counter_id):
    """Local counter ``counter_id`` since its last reset (negative: bad id)."""
    value = tl.cast(_check_handle(win), tl.int64)
    if value == 0:
        w = _words(win)
        if _id_ok(w, _W_COUNTER_COUNT, counter_id):
            value = _observe(w, _COUNTER, 0, counter_id, 0)
        else:
            value = tl.cast(_E_COUNTER_ID, tl.int64)
    return value


@triton.jit
def reset_counter(win, counter_id):
    """Set local counter ``counter_id`` back to 0."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        if _id_ok(w, _W_COUNTER_COUNT, counter_id):
            at = _i64(counter_id)
            now = tl.load(_array(w, _W_COUNTERS) + at, volatile=True)
            tl.store(_array(w, _W_COUNTER_BASE) + at, now)
        else:
            _record(w, _E_COUNTER_ID, _OP_READ, -1, counter_id, 0, 0)
            rc = tl.cast(_E_COUNTER_ID, tl.int32)
    return rc


# -- ordering, completion, barriers ------------------------------------------------------


@triton.jit
def fence(win):
    """Order earlier puts and signals before later ones. The proxy carries commands out in
    ring order, so this only checks the handle (and orders this program's stores)."""
    rc = _check_handle(win)
    if rc == 0:
        tl.debug_barrier()
    return rc


@triton.jit
def flush_block(win):
    """Wait until every command queued on this window so far has been carried out."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        queued = tl.load(w + _W_HEAD, volatile=True)
        rc = _wait(w, _DONE, _OP_FLUSH, -1, -1, queued)
    return rc


@triton.jit
def barrier_block(win, barrier_id):
    """A barrier of every rank of the window (after this window's earlier puts land)."""
    rc = _check_handle(win)
    if rc == 0:
        w = _words(win)
        if _id_ok(w, _W_BARRIER_COUNT, barrier_id):
            at = _array(w, _W_BARRIER_ROUND) + _i64(barrier_id)
            round = tl.atomic_add(at, _i64(1)) + 1
            me = tl.load(w + _W_RANK)
            rc = _push(w, _OP_BARRIER, me, 0, 0, 0, 0, barrier_id, round)
            if rc == 0:
                rc = _wait(w, _BARRIER, _OP_BARRIER_WAIT, -1, barrier_id, round)
        else:
            _record(w, _E_BARRIER_ID, _OP_BARRIER, -1, barrier_id, 0, 0)
            rc = tl.cast(_E_BARRIER_ID, tl.int32)
    return rc


# -- properties and local copies ---------------------------------------------------------


@triton.jit
def rank(win):
    """This rank in the window."""
    return tl.load(_words(win) + _W_RANK).to(tl.int32)


@triton.jit
def num_ranks(win):
    """The window's number of ranks."""
    return tl.load(_words(win) + _W_NRANKS).to(tl.int32)


@triton.jit
def base(win):
    """The address of this rank's window buffer (``.to(tl.pointer_type(...))`` to use it)."""
    return tl.load(_words(win) + _W_BASE)


@triton.jit
def size(win):
    """This rank's window in bytes."""
    w = _words(win)
    return tl.load(_array(w, _W_PEER_BYTES) + tl.load(w + _W_RANK))


@triton.jit
def self_copy_block(dst_ptr, dst_offset, src_ptr, src_offset, bytes):
    """Copy ``bytes`` between local buffers (pointers; byte offsets), e.g. an all-to-all's
    share for this rank. Returns 0."""
    dst = dst_ptr.to(tl.pointer_type(tl.uint8), bitcast=True) + _i64(dst_offset)
    src = src_ptr.to(tl.pointer_type(tl.uint8), bitcast=True) + _i64(src_offset)
    offs = tl.arange(0, 1024)
    nbytes = _i64(bytes)
    for start in range(0, nbytes, 1024):
        mask = start + offs < nbytes
        tl.store(dst + start + offs, tl.load(src + start + offs, mask=mask), mask=mask)
    return tl.cast(0, tl.int32)
