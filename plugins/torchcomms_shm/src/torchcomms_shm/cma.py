"""Cross-memory attach: read a peer process's memory in one copy (``process_vm_readv``).

Large all-gathers and all-to-alls read each block straight from the owner's
tensor into the reader's, instead of the owner copying it into shared memory and the
reader copying it out again: one copy instead of two, and half the memory traffic.

The kernel allows it when this process may ptrace the peer (same user, and under Yama's
``ptrace_scope`` 1 only a descendant, unless it holds ``CAP_SYS_PTRACE``), which is why
every communicator probes it at init (:func:`probe`) and falls back to staging through
the arena when any pair of ranks cannot.

May import: the standard library and ``torchcomms_core.plugin``.
"""

from __future__ import annotations

import ctypes
import os

from torchcomms_core.plugin import CommOperationError


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _bind() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [
        ctypes.c_int,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.POINTER(_IoVec),
        ctypes.c_ulong,
        ctypes.c_ulong,
    ]
    return fn


_readv = _bind()

#: Bytes one ``process_vm_readv`` call moves at most (the kernel pins the remote pages of a
#: call; smaller calls keep that bounded and let a long read be retried where it stopped).
_PIECE = 64 << 20


def read(pid: int, dst: int, src: int, nbytes: int) -> None:
    """Copy ``nbytes`` from address ``src`` of process ``pid`` to ``dst`` in this one."""
    if _readv is None:
        raise CommOperationError("process_vm_readv is not available in this C library")
    done = 0
    while done < nbytes:
        m = min(_PIECE, nbytes - done)
        local = _IoVec(dst + done, m)
        remote = _IoVec(src + done, m)
        got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            raise CommOperationError(
                f"reading {nbytes} bytes from process {pid} failed: {os.strerror(err)} "
                f"(errno {err}); if the peer is alive, disable cross-memory reads with the "
                f"hint cma_bytes=0"
            )
        done += got


def probe(pid: int, address: int, expect: bytes) -> bool:
    """Whether this process can read ``expect`` at ``address`` of process ``pid``."""
    if _readv is None:
        return False
    buf = ctypes.create_string_buffer(len(expect))
    local = _IoVec(ctypes.addressof(buf), len(expect))
    remote = _IoVec(address, len(expect))
    got = _readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    return got == len(expect) and buf.raw == expect
