"""The conformance suite's device-window contracts (#56): Triton kernels put, signal and wait
on the backend's windows, and bad calls are refused before anything is queued.

Importing this module needs triton. On a CPU device the kernels run under Triton's
interpreter (``TRITON_INTERPRET=1`` is set here, before triton is imported, unless the
environment already says otherwise). Each body returns ``None`` on a backend without windows.
"""

from __future__ import annotations

import ctypes
import os
import time
from datetime import timedelta
from typing import Any

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from torchcomms_core.comm.create import new_comm  # noqa: E402
from torchcomms_core.device import layout as L  # noqa: E402
from torchcomms_core.device.functions import (  # noqa: E402
    num_ranks,
    put_block,
    rank,
    read_signal,
    signal_block,
    wait_counter,
    wait_signal_from,
)
from torchcomms_core.testing.pool import unique_name  # noqa: E402

#: Elements of the row every rank puts into every peer's window.
ROW = 33


@triton.jit
def _exchange_kernel(win, src, row_bytes, out):  # type: ignore[no-untyped-def]
    """Program p puts this rank's row into peer p's window, then waits for peer p's row."""
    p = tl.program_id(0)
    rc = put_block(win, rank(win) * row_bytes, src, 0, p, row_bytes, 0, 0)
    if rc == 0:
        rc = wait_signal_from(win, p, 0, 1)
    tl.store(out + p, rc)


@triton.jit
def _settle_kernel(win, out):  # type: ignore[no-untyped-def]
    tl.store(out + 0, wait_counter(win, 0, num_ranks(win)).to(tl.int64))
    tl.store(out + 1, read_signal(win, 0))


@triton.jit
def _refused_kernel(win, src, peer, window_bytes, out):  # type: ignore[no-untyped-def]
    tl.store(out + 0, put_block(win, 0, src, 0, num_ranks(win), 4, 0, 0))
    tl.store(out + 1, put_block(win, window_bytes, src, 0, peer, 4, 0, 0))
    tl.store(out + 2, put_block(win, 0, src + 1, 0, peer, 4, 0, 0))
    tl.store(out + 3, put_block(win, 0, src, 0, peer, 4, 5, 0))
    tl.store(out + 4, signal_block(win, peer, -1, 1))


@triton.jit
def _wait_kernel(win, peer, out):  # type: ignore[no-untyped-def]
    tl.store(out, wait_signal_from(win, peer, 0, 1))


def _window(backend: str, device: str, numel: int, timeout: timedelta | None = None) -> Any:
    comm = new_comm(backend, torch.device(device), name=unique_name("devwin"), timeout=timeout)
    if comm.method_support().get("new_window") != "native":
        comm.finalize()
        return None, None
    return comm, comm.new_window(torch.zeros(numel, device=device))


def body_device_exchange(backend: str, device: str) -> dict[str, Any] | None:
    """Every rank puts a row into every rank's window with a signal; returns what it saw."""
    comm, win = _window(backend, device, ROW * 64)
    if comm is None:
        return None
    me, n = comm.get_rank(), comm.get_size()
    handle = win.get_device_window(signal_count=1, counter_count=1)
    source = torch.arange(ROW, dtype=torch.float32) + 1000 * me
    buffer = win.register_local_buffer(source)
    codes = torch.full((n,), 99, dtype=torch.int32)
    _exchange_kernel[(n,)](handle, buffer, ROW * 4, codes)
    settled = torch.zeros(2, dtype=torch.int64)
    _settle_kernel[(1,)](handle, settled)
    win.check_device_errors()
    want = torch.cat([torch.arange(ROW, dtype=torch.float32) + 1000 * r for r in range(n)])
    exact = torch.equal(win.get_tensor()[: n * ROW].cpu(), want)
    win.deregister_local_buffer(buffer)
    win.tensor_deregister()
    comm.finalize()
    return {"codes": codes.tolist(), "settled": settled.tolist(), "exact": exact, "n": n}


def body_device_refusals(backend: str, device: str) -> dict[str, Any] | None:
    """Bad ranks, ranges, buffers and ids: their codes, and whether anything was queued."""
    comm, win = _window(backend, device, 16)
    if comm is None:
        return None
    me, n = comm.get_rank(), comm.get_size()
    handle = win.get_device_window(signal_count=1, counter_count=1)
    buffer = win.register_local_buffer(torch.ones(4))
    codes = torch.zeros(5, dtype=torch.int32)
    _refused_kernel[(1,)](handle, buffer, (me + 1) % n, 16 * 4, codes)
    queued = ctypes.c_int64.from_address(handle + 8 * L.HEAD).value
    try:
        win.check_device_errors()
        raised = ""
    except Exception as exc:  # noqa: BLE001 - the type is what the contract checks
        raised = type(exc).__name__
    comm.barrier(False)
    untouched = bool((win.get_tensor() == 0).all())
    win.tensor_deregister()
    comm.finalize()
    return {"codes": codes.tolist(), "queued": queued, "raised": raised, "untouched": untouched}


def body_device_timeout(backend: str, device: str, seconds: float) -> dict[str, Any] | None:
    """Rank 0 waits for a signal rank 1 never sends: the code, the time, the host's error."""
    # Made with the usual timeout (a short one would also bound the rendezvous of many
    # ranks on a busy machine); the device window takes the short one, set once all arrived.
    comm, win = _window(backend, device, 8)
    if comm is None:
        return None
    comm.barrier(False, timeout=timedelta(seconds=seconds + 60))
    comm.set_timeout(timedelta(seconds=seconds))
    handle = win.get_device_window()
    code, elapsed, message = 0, 0.0, ""
    if comm.get_rank() == 0:
        out = torch.zeros(1, dtype=torch.int32)
        start = time.monotonic()
        _wait_kernel[(1,)](handle, 1, out)
        elapsed, code = time.monotonic() - start, int(out[0])
        try:
            win.check_device_errors()
        except Exception as exc:  # noqa: BLE001 - the message is what the contract checks
            message = f"{type(exc).__name__}: {exc}"
    comm.barrier(False, timeout=timedelta(seconds=seconds + 60))
    win.tensor_deregister()
    comm.finalize()
    return {"code": code, "elapsed": elapsed, "message": message}
