"""The device window's proxy in C (``native_proxy.c``), for windows whose every peer's memory
is mapped into this process (#56).

The Python proxy (``proxy.Proxy``) needs the interpreter lock for every command, so a
command waits until the thread that holds it (often the rank's own host code, polling)
lets go. Where the window's engine and the signal window's engine both say
``WIN_ACCESS_TYPE_UNIFIED`` for every peer and hand out ``map_remote`` views (the shm
backend's windows; gloo's between ranks of one host), every command is a copy or a store
into mapped memory, and a C thread can carry it out without the lock. It follows the same
protocol, checks every command the same way and records the same failures
(docs/device.md); the Python clock thread still advances ``TICK``.

The C source is built on first use like the shm backend's (``NativeBuild``); without a
compiler, or with ``TORCHCOMM_DEVICE_NATIVE_PROXY=0``, the Python proxy serves every window.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from pathlib import Path
from typing import Any

import torch

from torchcomms_core.device import layout as L
from torchcomms_core.device.proxy import BUSY_S, NAP_S, Clock
from torchcomms_core.spec.native_build import NativeBuild

_log = logging.getLogger(__name__)

_BUILD = NativeBuild(
    "device_proxy",
    Path(__file__).with_name("native_proxy.c"),
    "TORCHCOMM_DEVICE_NATIVE_PROXY",
    "device windows use the Python proxy",
    extra=("-lpthread",),
)
#: ``layout``'s numbers in the order ``tc_proxy_layout`` reports them.
_LAYOUT = (
    L.RANK, L.NRANKS, L.SIGNAL_COUNT, L.COUNTER_COUNT, L.BARRIER_COUNT, L.RING, L.CAPACITY,
    L.HEAD, L.TAIL, L.DONE, L.COUNTERS, L.BUFFERS, L.PEER_BYTES, L.ELEMENT, L.ABORT,
    L.ERR_CODE, L.ERR_OP, L.ERR_PEER, L.ERR_ID, L.ERR_EXPECTED, L.ERR_SEEN, L.DESC_WORDS,
    L.OPCODE_MASK, L.PHASE_SHIFT, L.MAX_BUFFERS, L.BUFFER_WORDS, L.B_GENERATION, L.B_BYTES,
    L.HANDLE_SHIFT, L.OP_PUT, L.OP_SIGNAL, L.OP_BARRIER, L.ABORTED, L.PROXY_FAILED,
    L.E_HANDLE, L.E_RANK, L.E_SIGNAL_ID, L.E_COUNTER_ID, L.E_BARRIER_ID, L.E_BUFFER,
    L.E_RANGE, L.E_ALIGN,
)  # fmt: skip
#: Proxies whose thread did not end in time: their plans stay alive as long as it may run.
_LINGERING: list[Any] = []


class _Plan(ctypes.Structure):
    """``tc_proxy`` of ``native_proxy.c``, field for field."""

    _fields_ = [
        ("state", ctypes.c_void_p),
        ("data_bases", ctypes.c_void_p),
        ("signal_bases", ctypes.c_void_p),
        ("sources", ctypes.c_void_p),
        ("sent", ctypes.c_void_p),
        ("barrier_at", ctypes.c_int64),
        ("busy_ns", ctypes.c_int64),
        ("nap_ns", ctypes.c_int64),
        ("stop", ctypes.c_int64),
        ("running", ctypes.c_int64),
        ("thread", ctypes.c_uint64),  # pthread_t: an unsigned long on Linux
    ]


_lock = threading.Lock()
_library: Any = None
_tried = False


def library() -> Any:
    """The loaded C proxy, or ``None`` (no compiler, switched off, or a layout that does not
    match ``layout``'s; said in the log). ``TORCHCOMM_DEVICE_NATIVE_PROXY=0`` is read at
    every call, so it takes effect for the windows made after it is set."""
    global _library, _tried
    if _BUILD.disabled():
        return None
    with _lock:
        if _tried:
            return _library
        _tried = True
        path = _BUILD.path()
        if path is None:
            return None
        try:
            lib = ctypes.CDLL(str(path))  # the thread runs without the interpreter lock
        except OSError as exc:
            _log.warning("torchcomms: loading %s failed; the Python proxy serves: %s", path, exc)
            return None
        room = 128
        words = (ctypes.c_int64 * room)()
        n = lib.tc_proxy_layout(words, ctypes.c_int64(room))
        if tuple(words[:n]) != _LAYOUT:
            _log.warning("torchcomms: %s was built from another layout; not used", path)
            return None
        for name in ("tc_proxy_start", "tc_proxy_join"):
            getattr(lib, name).restype = ctypes.c_int
        lib.tc_proxy_stop.restype = None
        lib.tc_proxy_join.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        _library = lib
        return lib


def mapped_peers(engine: Any, size: int) -> list[int] | None:
    """Every rank's buffer address in ``engine``'s window, where each is mapped into this
    process (``WIN_ACCESS_TYPE_UNIFIED`` and ``map_remote``); ``None`` where one is not."""
    access = getattr(engine, "access_type", None)
    mapper = getattr(engine, "map_remote", None)
    if access is None or mapper is None:
        return None
    try:
        addresses = []
        for rank in range(size):
            if getattr(access(rank), "name", "") != "WIN_ACCESS_TYPE_UNIFIED":
                return None
            view = mapper(rank)
            if not isinstance(view, torch.Tensor) or view.device.type != "cpu":
                return None
            addresses.append(view.data_ptr())
        return addresses
    except (NotImplementedError, RuntimeError, IndexError):
        return None


class NativeProxy:
    """The C thread that drains ``state``'s ring, with the interface of ``proxy.Proxy``.

    Args:
        state: the window's state block; ``data_bases``/``signal_bases``: every rank's
            window and signal words, mapped here; ``sources``: the ``MAX_BUFFERS`` words
            ``register_buffer`` writes source addresses into; ``sent``: ``size x
            signal_count`` zeros (the running totals); ``barrier_at``: the first barrier
            word of the signal words; ``keep``: the memory ``state`` points into, kept
            alive as long as the thread may run.
    """

    def __init__(
        self,
        lib: Any,
        state: ctypes.Array[ctypes.c_int64],
        data_bases: list[int],
        signal_bases: list[int],
        sources: torch.Tensor,
        sent: torch.Tensor,
        barrier_at: int,
        name: str,
        keep: Any,
    ) -> None:
        self._lib, self._state = lib, state
        self._data = torch.tensor(data_bases, dtype=torch.int64)
        self._signals = torch.tensor(signal_bases, dtype=torch.int64)
        self._keep = (sources, sent, keep)
        plan = _Plan()
        plan.state = ctypes.addressof(state)
        plan.data_bases, plan.signal_bases = self._data.data_ptr(), self._signals.data_ptr()
        plan.sources, plan.sent = sources.data_ptr(), sent.data_ptr()
        plan.barrier_at = barrier_at
        plan.busy_ns, plan.nap_ns = int(BUSY_S * 1e9), int(NAP_S * 1e9)
        self._plan = plan
        #: Always ``None``: a command the C proxy refuses is recorded in the state block.
        self.failure: BaseException | None = None
        self._clock = Clock(state, name)
        rc = lib.tc_proxy_start(ctypes.byref(plan))
        if rc:
            self._clock.stop(1.0)
            raise OSError(rc, f"starting the native proxy of {name} failed")
        self._joined = False

    def alive(self) -> bool:
        """Whether the thread still drains the ring."""
        return bool(self._plan.running)

    def abort(self) -> None:
        """Wake every waiting kernel with ``E_ABORTED`` and stop draining (returns at once)."""
        if not self._state[L.ABORT]:
            self._state[L.ABORT] = L.ABORTED
        self._lib.tc_proxy_stop(ctypes.byref(self._plan))

    def stop(self, timeout_s: float) -> None:
        """Stop the thread once the command it is carrying out has finished."""
        self.abort()
        if not self._joined:
            if self._lib.tc_proxy_join(ctypes.byref(self._plan), int(timeout_s * 1e9)):
                _LINGERING.append(self)  # still copying: its memory must outlive it
            else:
                self._joined = True
        self._clock.stop(timeout_s)
