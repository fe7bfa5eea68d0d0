"""The command ring of a device window in one process (#56): the lap bit across laps, a
host writer, and what a kernel meets when the ring is full.

The window's engines here are a loopback stand-in (one rank), so the proxy can be held up
at will; the kernels run under Triton's interpreter. Skipped where triton is missing.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason="device windows run Triton kernels: pip install 'torchcomms-core[triton]'"
)
import triton.language as tl  # noqa: E402

from torchcomms.triton import put_block, read_signal, signal_block, wait_signal  # noqa: E402
from torchcomms_core.device import layout as L  # noqa: E402
from torchcomms_core.device.ring import Command  # noqa: E402
from torchcomms_core.device.window import DeviceWindow  # noqa: E402


class Loopback:
    """A one-rank window engine; ``gate``, when given, holds every put until it is set."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.tensor: torch.Tensor | None = None
        self.gate = gate
        self.puts = 0

    def register(self, tensor: torch.Tensor) -> list[int]:
        self.tensor = tensor
        return [tensor.numel()]

    def deregister(self) -> None:
        self.tensor = None

    def put(self, tensor, dst_rank, offset, async_op, timeout):
        if self.gate is not None:
            self.gate.wait()
        assert self.tensor is not None
        self.tensor.view(-1)[offset : offset + tensor.numel()].copy_(tensor)
        self.puts += 1

    def free(self, abort: bool = False) -> None:
        self.tensor = None


def _device(data: Loopback, seconds: float = 30.0) -> tuple[DeviceWindow, torch.Tensor]:
    window = torch.zeros(64, dtype=torch.float32)
    data.register(window)
    device = DeviceWindow(
        "test/window",
        0,
        1,
        data,
        Loopback(),
        torch.float32,
        [window.numel() * 4],
        window.data_ptr(),
        (1, 1, 1),
        timedelta(seconds=seconds),
    )
    return device, window


@triton.jit
def signals_kernel(win, count, out):
    """Queue ``count`` signals to this rank; ``out``: how many were queued, the last code."""
    queued = tl.cast(0, tl.int32)
    rc = tl.cast(0, tl.int32)
    for _ in range(0, count):
        if rc == 0:
            rc = signal_block(win, 0, 0, 1)
            if rc == 0:
                queued += 1
    tl.store(out + 0, queued)
    tl.store(out + 1, rc)


@triton.jit
def put_kernel(win, src, nbytes, out):
    tl.store(out, put_block(win, 0, src, 0, 0, nbytes, -1, 0))


@triton.jit
def put_then_wait_kernel(win, src, nbytes, expected, out):
    tl.store(out + 0, put_block(win, 0, src, 0, 0, nbytes, 0, 0))
    tl.store(out + 1, wait_signal(win, 0, expected))
    tl.store(out + 2, read_signal(win, 0).to(tl.int32))


def test_the_host_writer_and_the_proxy_agree_over_several_laps() -> None:
    device, _ = _device(Loopback())
    try:
        for _ in range(3 * L.RING_SLOTS + 5):
            assert device.ring.push(Command(L.OP_SIGNAL, 0, 0, 0, 0, 0, 0, 1), 10.0) == L.OK
        device.flush()
        assert device.word(L.DONE) == device.word(L.HEAD) == 3 * L.RING_SLOTS + 5
        out = torch.zeros(3, dtype=torch.int32)
        total = 3 * L.RING_SLOTS + 6  # the host's signals and the put's
        source = device.register_buffer(torch.ones(4))
        put_then_wait_kernel[(1,)](device.handle, source, 16, total, out)
        assert out.tolist() == [0, 0, total]
        assert device.failure() is None
    finally:
        device.close(collective=False)


def test_a_full_ring_refuses_after_the_timeout_and_writes_nothing() -> None:
    gate = threading.Event()
    data = Loopback(gate)
    device, window = _device(data, seconds=1.0)
    try:
        source = device.register_buffer(torch.full((4,), 7.0))
        out = torch.zeros(1, dtype=torch.int32)
        # The proxy takes this put and is held in it: every slot of the ring is free again.
        put_kernel[(1,)](device.handle, source, 16, out)
        while device.word(L.TAIL) < 1:
            pass
        assert out[0] == 0
        counts = torch.zeros(2, dtype=torch.int32)
        signals_kernel[(1,)](device.handle, L.RING_SLOTS + 1, counts)
        assert counts.tolist() == [L.RING_SLOTS, L.E_RING_FULL]
        assert device.word(L.HEAD) == L.RING_SLOTS + 1  # the refused command took no slot
        error = device.failure()
        assert error is not None and "ring stayed full" in str(error)
        device.clear_failure()
        gate.set()  # the proxy goes on: the put lands, then every queued signal
        device.flush()
        assert bool((window[:4] == 7.0).all()) and data.puts == 1
        assert device.word(L.DONE) == L.RING_SLOTS + 1
    finally:
        gate.set()
        device.close(collective=False)


def test_a_command_the_proxy_cannot_carry_out_wakes_waiters_with_e_proxy() -> None:
    device, _ = _device(Loopback())
    try:
        # A host writer is trusted less than a kernel: the proxy checks again and stops.
        assert device.ring.push(Command(L.OP_PUT, 0, 0, 999, 0, 4, -1, -1), 1.0) == L.OK
        out = torch.zeros(3, dtype=torch.int32)
        put_then_wait_kernel[(1,)](device.handle, 0, 4, 1, out)
        assert out[:2].tolist() == [L.E_BUFFER, L.E_PROXY]  # refused; then the proxy is gone
        error = device.failure()
        assert error is not None and "E_BUFFER" in str(error)
    finally:
        device.close(collective=False)
