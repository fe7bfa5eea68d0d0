"""Device windows (#56): Triton kernels put, signal and wait through the core's proxy, on
gloo and shm windows at 2 and 4 spawned ranks, and on mpi windows under mpiexec.

The kernels are the real device code, run on CPU tensors by Triton's interpreter
(``TRITON_INTERPRET=1``, set here before triton is imported, in the test process and in the
ranks, which import this module). Skipped, with the reason, where triton is not installed.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from datetime import timedelta

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason="device windows run Triton kernels: pip install 'torchcomms-core[triton]'"
)
import triton.language as tl  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms.triton import (  # noqa: E402
    barrier_block,
    fence,
    flush_block,
    num_ranks,
    put_block,
    rank,
    read_counter,
    read_signal,
    reset_counter,
    reset_signal,
    signal_block,
    wait_counter,
    wait_signal,
    wait_signal_from,
)
from torchcomms_core.device import layout as L  # noqa: E402
from torchcomms_core.testing import RankPool  # noqa: E402
from torchcomms_core.testing.pool import unique_name  # noqa: E402

BACKENDS = ["gloo", "shm"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- kernels -------------------------------------------------------------------------------


@triton.jit
def exchange_kernel(win, src, row_bytes, signal_id, counter_id, out):
    """Program p puts this rank's row into peer p's window (at this rank's row), then waits
    for peer p's row to arrive here."""
    p = tl.program_id(0)
    me = rank(win)
    rc = put_block(win, me * row_bytes, src, 0, p, row_bytes, signal_id, counter_id)
    if rc == 0:
        rc = wait_signal_from(win, p, signal_id, 1)
    tl.store(out + p, rc)


@triton.jit
def settle_kernel(win, signal_id, counter_id, out):
    """Every local put's source is reusable, every peer's signal is in; read, flush, barrier."""
    n = num_ranks(win)
    tl.store(out + 0, wait_counter(win, counter_id, n).to(tl.int64))
    tl.store(out + 1, wait_signal(win, signal_id, n).to(tl.int64))
    tl.store(out + 2, read_signal(win, signal_id))
    tl.store(out + 3, read_counter(win, counter_id))
    tl.store(out + 4, fence(win).to(tl.int64))
    tl.store(out + 5, flush_block(win).to(tl.int64))
    tl.store(out + 6, barrier_block(win, 0).to(tl.int64))
    tl.store(out + 7, reset_signal(win, signal_id).to(tl.int64))
    tl.store(out + 8, reset_counter(win, counter_id).to(tl.int64))
    tl.store(out + 9, read_signal(win, signal_id))
    tl.store(out + 10, read_counter(win, counter_id))


@triton.jit
def wait_from_kernel(win, peer, signal_id, expected, out):
    tl.store(out, wait_signal_from(win, peer, signal_id, expected))


@triton.jit
def put_kernel(win, dst_offset, src, src_offset, peer, nbytes, signal_id, counter_id, out):
    tl.store(out, put_block(win, dst_offset, src, src_offset, peer, nbytes, signal_id, counter_id))


@triton.jit
def calls_kernel(win, peer, bad_id, out):
    """Calls that must be refused: unknown ids and ranks."""
    tl.store(out + 0, signal_block(win, peer, bad_id, 1))
    tl.store(out + 1, wait_signal(win, bad_id, 1))
    tl.store(out + 2, wait_counter(win, bad_id, 1))
    tl.store(out + 3, barrier_block(win, bad_id))
    tl.store(out + 4, signal_block(win, num_ranks(win), 0, 1))
    tl.store(out + 5, read_signal(win, bad_id).to(tl.int32))


@triton.jit
def many_signals_kernel(win, count, out):
    """``count`` signals to the next rank: more than the ring holds."""
    me = rank(win)
    peer = (me + 1) % num_ranks(win)
    rc = tl.cast(0, tl.int32)
    for _ in range(0, count):
        if rc == 0:
            rc = signal_block(win, peer, 0, 1)
    if rc == 0:
        rc = wait_signal_from(win, (me + num_ranks(win) - 1) % num_ranks(win), 0, count)
    tl.store(out, rc)


# -- bodies (run on every rank) ------------------------------------------------------------


def _window(backend: str, n: int, dtype: torch.dtype = torch.float32, timeout_s: float = 0):
    kwargs = {"timeout": timedelta(seconds=timeout_s)} if timeout_s else {}
    comm = torchcomms.new_comm(backend, torch.device("cpu"), name=unique_name("dev"), **kwargs)
    win = comm.new_window(torch.zeros(n, dtype=dtype))
    return comm, win


def _exchange(backend: str, row: int) -> dict:
    comm, win = _window(backend, 4 * 16)
    me, n = comm.get_rank(), comm.get_size()
    handle = win.get_device_window(signal_count=2, counter_count=2)
    assert win.get_device_window(signal_count=2, counter_count=2) == handle  # cached
    src = torch.arange(row, dtype=torch.float32) + 100 * me
    buf = win.register_local_buffer(src)
    out = torch.full((n,), 99, dtype=torch.int32)
    exchange_kernel[(n,)](handle, buf, row * 4, 1, 0, out)
    settled = torch.zeros(11, dtype=torch.int64)
    settle_kernel[(1,)](handle, 1, 0, settled)
    win.check_device_errors()
    got = win.get_tensor()[: n * row].clone()
    expected = torch.cat([torch.arange(row, dtype=torch.float32) + 100 * r for r in range(n)])
    win.deregister_local_buffer(buf)
    win.tensor_deregister()
    comm.finalize()
    return {
        "codes": out.tolist(),
        "settled": settled.tolist(),
        "exact": torch.equal(got, expected),
        "n": n,
    }


def _timeout(backend: str) -> dict:
    comm, win = _window(backend, 8, timeout_s=1.5)
    me, n = comm.get_rank(), comm.get_size()
    handle = win.get_device_window()
    out = torch.zeros(1, dtype=torch.int32)
    message, kind, elapsed = "", "", 0.0
    if me == 0:
        start = time.monotonic()
        wait_from_kernel[(1,)](handle, 1, 1, 1, out)
        elapsed = time.monotonic() - start
        try:
            win.check_device_errors()
        except torchcomms.CommTimeoutError as exc:
            message, kind = str(exc), type(exc).__name__
    comm.barrier(False, timeout=timedelta(seconds=60))
    win.tensor_deregister()
    comm.finalize()
    return {"code": int(out[0]), "message": message, "kind": kind, "elapsed": elapsed, "n": n}


def _abort(backend: str) -> dict:
    comm, win = _window(backend, 8, timeout_s=60)
    me, n = comm.get_rank(), comm.get_size()
    handle = win.get_device_window()
    out = torch.zeros(1, dtype=torch.int32)
    timer = threading.Timer(0.5, comm.abort)
    timer.start()
    start = time.monotonic()
    wait_from_kernel[(1,)](handle, (me + 1) % n, 0, 1, out)  # no one signals
    elapsed = time.monotonic() - start
    timer.join()
    try:
        win.check_device_errors()
        message = ""
    except torchcomms.CommStateError as exc:
        message = str(exc)
    return {"code": int(out[0]), "elapsed": elapsed, "message": message}


def _killed(backend: str) -> dict:
    comm, win = _window(backend, 8, timeout_s=3)
    me = comm.get_rank()
    handle = win.get_device_window()
    comm.barrier(False)  # every rank has its device window
    if me == 1:
        os.kill(os.getpid(), signal.SIGKILL)  # a peer dies with kernels waiting on it
    out = torch.zeros(1, dtype=torch.int32)
    start = time.monotonic()
    wait_from_kernel[(1,)](handle, 1, 0, 1, out)
    elapsed = time.monotonic() - start
    try:
        win.check_device_errors()
        message = ""
    except torchcomms.CommTimeoutError as exc:
        message = str(exc)
    comm.abort()
    return {"code": int(out[0]), "elapsed": elapsed, "message": message}


def _refused(backend: str) -> dict:
    comm, win = _window(backend, 16)
    me, n = comm.get_rank(), comm.get_size()
    errors = {}
    src = torch.ones(4, dtype=torch.float32)
    try:
        win.register_local_buffer(src)
    except torchcomms.CommStateError as exc:
        errors["before_handle"] = str(exc)
    handle = win.get_device_window(signal_count=2, counter_count=1, barrier_count=1)
    try:
        win.get_device_window(signal_count=3)
    except torchcomms.CommStateError as exc:
        errors["other_counts"] = str(exc)
    try:
        win.register_local_buffer(torch.ones(4, 2).t())
    except torchcomms.CommInputError as exc:
        errors["strided"] = str(exc)
    buf = win.register_local_buffer(src)
    gone = win.register_local_buffer(torch.ones(4))
    win.deregister_local_buffer(gone)
    peer = (me + 1) % n
    out = torch.zeros(1, dtype=torch.int32)
    cases = {
        "rank": (0, buf, 0, n, 16),
        "dst_past_end": (64 - 8, buf, 0, peer, 16),
        "src_past_end": (0, buf, 8, peer, 16),
        "negative": (-4, buf, 0, peer, 4),
        "unregistered": (0, 12345, 0, peer, 4),
        "deregistered": (0, gone, 0, peer, 4),
        "misaligned": (2, buf, 0, peer, 4),
    }
    codes = {}
    for name, (dst_offset, src_handle, src_offset, dst, nbytes) in cases.items():
        put_kernel[(1,)](handle, dst_offset, src_handle, src_offset, dst, nbytes, 0, 0, out)
        codes[name] = int(out[0])
    put_kernel[(1,)](handle, 0, buf, 0, peer, 4, 2, 0, out)
    codes["signal_id"] = int(out[0])
    put_kernel[(1,)](handle, 0, buf, 0, peer, 4, 0, 1, out)
    codes["counter_id"] = int(out[0])
    many = torch.zeros(6, dtype=torch.int32)
    calls_kernel[(1,)](handle, peer, 7, many)
    # The handle is the address of the window's state block (torchcomms_core.device.layout).
    queued = ctypes.c_int64.from_address(handle + 8 * L.HEAD).value
    try:
        win.check_device_errors()
    except torchcomms.CommInputError as exc:
        errors["first"] = str(exc)
    win.check_device_errors()  # reported once
    comm.barrier(False)
    untouched = bool((win.get_tensor() == 0).all())
    win.tensor_deregister()
    comm.finalize()
    return {
        "codes": codes,
        "calls": many.tolist(),
        "queued": queued,
        "untouched": untouched,
        "errors": errors,
        "name": f"{comm.get_name()}/window",
    }


def _ring_laps(backend: str, count: int) -> dict:
    comm, win = _window(backend, 8)
    handle = win.get_device_window(signal_count=1)
    out = torch.zeros(1, dtype=torch.int32)
    many_signals_kernel[(1,)](handle, count, out)
    win.check_device_errors()
    comm.barrier(False)
    win.tensor_deregister()
    comm.finalize()
    return {"code": int(out[0])}


# -- tests ---------------------------------------------------------------------------------


def _check_exchange(result: dict) -> None:
    n = result["n"]
    assert result["codes"] == [0] * n
    assert result["exact"]
    counter, signal, read_sig, read_ctr, fenced, flushed, barrier, rs, rc, sig0, ctr0 = result[
        "settled"
    ]
    assert (counter, signal, fenced, flushed, barrier, rs, rc) == (0,) * 7
    assert (read_sig, read_ctr) == (n, n)
    assert (sig0, ctr0) == (0, 0)


def test_put_signal_wait_delivers_every_row_exactly(pool: RankPool, backend: str) -> None:
    for result in pool.run(_exchange, backend, 16, timeout=120):
        _check_exchange(result)


def test_a_signal_that_never_comes_times_out_naming_window_peer_and_signal(
    pool: RankPool, backend: str
) -> None:
    results = pool.run(_timeout, backend, timeout=120)
    first = results[0]
    assert first["code"] == L.E_TIMEOUT
    assert 1.4 <= first["elapsed"] < 10
    assert first["kind"] == "CommTimeoutError"
    message = first["message"]
    assert "/window" in message and "signal 1 from peer 1" in message
    assert "wait_signal_from" in message


def test_abort_wakes_a_waiting_kernel(pool: RankPool, backend: str) -> None:
    for result in pool.run(_abort, backend, timeout=120):
        assert result["code"] == L.E_ABORTED
        assert result["elapsed"] < 10
        assert "aborted" in result["message"]


def test_a_killed_peer_ends_every_wait_on_it_within_the_timeout(
    pool: RankPool, backend: str
) -> None:
    outcomes = pool.run_outcomes(_killed, backend, timeout=120)
    assert outcomes[1].status == "died"
    for outcome in outcomes[:1] + outcomes[2:]:
        assert outcome.ok, outcome
        result = outcome.value
        assert result["code"] == L.E_TIMEOUT
        assert result["elapsed"] < 3 + 5
        assert "signal 0 from peer 1" in result["message"]


def test_bad_offsets_ids_and_buffers_are_refused_before_anything_is_written(
    pool: RankPool, backend: str
) -> None:
    for result in pool.run(_refused, backend, timeout=120):
        assert result["codes"] == {
            "rank": L.E_RANK,
            "dst_past_end": L.E_RANGE,
            "src_past_end": L.E_RANGE,
            "negative": L.E_RANGE,
            "unregistered": L.E_BUFFER,
            "deregistered": L.E_BUFFER,
            "misaligned": L.E_ALIGN,
            "signal_id": L.E_SIGNAL_ID,
            "counter_id": L.E_COUNTER_ID,
        }
        assert result["calls"] == [
            L.E_SIGNAL_ID,
            L.E_SIGNAL_ID,
            L.E_COUNTER_ID,
            L.E_BARRIER_ID,
            L.E_RANK,
            L.E_SIGNAL_ID,
        ]
        assert result["queued"] == 0
        assert result["untouched"]
        errors = result["errors"]
        assert "get_device_window" in errors["before_handle"]
        assert "counts" in errors["other_counts"]
        assert "contiguous" in errors["strided"]
        assert "E_RANK" in errors["first"] and "nothing was queued" in errors["first"]


def test_a_kernel_queueing_more_than_the_ring_holds_waits_for_free_slots(
    pool2: RankPool, backend: str
) -> None:
    count = L.RING_SLOTS + L.RING_SLOTS // 2
    assert [r["code"] for r in pool2.run(_ring_laps, backend, count, timeout=180)] == [0, 0]


def test_put_signal_wait_on_mpi_windows(mpi_pool: RankPool) -> None:
    """The same exchange on MPI RMA windows (ranks under mpiexec; skipped without it)."""
    for result in mpi_pool.run(_exchange, "mpi", 16, timeout=120):
        _check_exchange(result)


# -- a backend with its own device path --------------------------------------------------


class _NativeSide:
    """A backend's own device side (``spec.window.DeviceSide``), recording what it is asked."""

    handle = 4242

    def __init__(self, counts: tuple[int, int, int]) -> None:
        self.counts = counts
        self.calls: list[str] = []

    def register_buffer(self, tensor: torch.Tensor) -> int:
        self.calls.append("register")
        return 7

    def deregister_buffer(self, handle: int) -> None:
        self.calls.append(f"deregister {handle}")

    def failure(self) -> Exception | None:
        return None

    def clear_failure(self) -> None:
        pass

    def abort(self) -> None:
        self.calls.append("abort")

    def close(self, collective: bool) -> None:
        self.calls.append(f"close collective={collective}")


class _NativeEngine:
    """gloo's window engine plus ``device_window``: the core must start no proxy for it."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.side: _NativeSide | None = None

    def device_window(self, counts, timeout):
        self.side = _NativeSide(counts)
        return self.side

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def _native(name: str) -> dict:
    from torchcomms_gloo import GlooBackend

    engines: list[_NativeEngine] = []

    class NativeDeviceGloo(GlooBackend):
        def new_window(self):
            engines.append(_NativeEngine(super().new_window()))
            return engines[-1]

    torchcomms.register_backend(name, NativeDeviceGloo)
    try:
        comm = torchcomms.new_comm(name, torch.device("cpu"), name=unique_name("native"))
        win = comm.new_window(torch.zeros(8))
        handle = win.get_device_window(signal_count=3)
        buffer = win.register_local_buffer(torch.ones(2))
        win.deregister_local_buffer(buffer)
        win.check_device_errors()
        win.tensor_deregister()
        comm.finalize()
    finally:
        torchcomms.unregister_backend(name)
    side = engines[0].side
    assert side is not None
    proxies = [t.name for t in threading.enumerate() if t.name.startswith("torchcomms-proxy")]
    return {
        "handle": handle,
        "buffer": buffer,
        "counts": side.counts,
        "calls": side.calls,
        "windows": len(engines),
        "proxies": proxies,
    }


def test_a_backend_with_a_native_device_path_serves_the_device_window(pool2: RankPool) -> None:
    for result in pool2.run(_native, "native_device_gloo", timeout=120):
        assert result["handle"] == 4242 and result["buffer"] == 7
        assert result["counts"] == (3, 2, 1)
        assert result["calls"] == ["register", "deregister 7", "close collective=True"]
        assert result["windows"] == 1  # no signal window: the core's proxy never started
        assert result["proxies"] == []
