"""The C proxy of device windows whose peers are mapped into every rank (#56): which proxy a
window gets, large puts ordered before their signal, the same refusals as the Python proxy
when a host writer queues what a kernel would never, and the Python proxy still exact on
the same backends when the C one is switched off.

Real rank processes on gloo and shm (both map every peer's window on one host). The kernel
here runs under Triton's interpreter; where triton is missing these tests are skipped.
"""

from __future__ import annotations

import os
import shutil

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason="device windows run Triton kernels: pip install 'torchcomms-core[triton]'"
)
import triton.language as tl  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms.triton import put_block, wait_signal_from  # noqa: E402
from torchcomms_core.device import layout as L  # noqa: E402
from torchcomms_core.device.ring import Command, CommandRing, words_at  # noqa: E402
from torchcomms_core.testing import RankPool  # noqa: E402
from torchcomms_core.testing.pool import unique_name  # noqa: E402

SWITCH = "TORCHCOMM_DEVICE_NATIVE_PROXY"
needs_cc = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")),
    reason="no C compiler: the C proxy is not built",
)


@pytest.fixture(params=["gloo", "shm"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@triton.jit
def ring_exchange_kernel(win, src, nbytes, rounds, before, out):
    """``rounds`` times: put ``nbytes`` to the next rank with signal 0, wait for the previous
    rank's (``before`` signals arrived earlier); ``out``: the first nonzero code."""
    me = tl.load(tl.cast(win, tl.pointer_type(tl.int64)) + L.RANK)
    n = tl.load(tl.cast(win, tl.pointer_type(tl.int64)) + L.NRANKS)
    rc = tl.cast(0, tl.int32)
    for r in range(0, rounds):
        if rc == 0:
            rc = put_block(win, 0, src, 0, (me + 1) % n, nbytes, 0, -1)
        if rc == 0:
            rc = wait_signal_from(win, (me + n - 1) % n, 0, before + r + 1)
    tl.store(out, rc)


def _exchange(backend: str, native: bool, numel: int, rounds: int) -> dict:
    """Each round a fresh source pattern lands whole at the next rank before its signal."""
    os.environ[SWITCH] = "1" if native else "0"
    try:
        comm = torchcomms.new_comm(backend, torch.device("cpu"), name=unique_name("nat"))
        me, n = comm.get_rank(), comm.get_size()
        win = comm.new_window(torch.zeros(numel, dtype=torch.float32))
        handle = win.get_device_window(signal_count=1, counter_count=1)
        kind = win._device.proxy_kind
        src = torch.empty(numel, dtype=torch.float32)
        buf = win.register_local_buffer(src)
        out = torch.zeros(1, dtype=torch.int32)
        exact = True
        prev = (me + n - 1) % n
        for r in range(rounds):
            src.copy_(torch.arange(numel, dtype=torch.float32) + 1000 * me + r)
            ring_exchange_kernel[(1,)](handle, buf, numel * 4, 1, r, out)
            got = win.get_tensor()
            # The signal of round r arrived: the whole put of round r is there.
            want = torch.arange(numel, dtype=torch.float32) + 1000 * prev + r
            exact = exact and int(out[0]) == 0 and torch.equal(got, want)
            comm.barrier(False)  # nobody overwrites a buffer its peer is still reading
        win.check_device_errors()
        win.deregister_local_buffer(buf)
        win.tensor_deregister()
        comm.finalize()
        return {"kind": kind, "exact": exact, "code": int(out[0])}
    finally:
        os.environ.pop(SWITCH, None)


@needs_cc
def test_mapped_windows_get_the_c_proxy_and_large_puts_land_before_their_signal(
    pool: RankPool, backend: str
) -> None:
    # 4 MiB puts: large enough for memcpy's non-temporal stores.
    for result in pool.run(_exchange, backend, True, 1 << 20, 6, timeout=180):
        assert result == {"kind": "native", "exact": True, "code": 0}


def test_the_python_proxy_serves_when_the_c_one_is_switched_off(
    pool2: RankPool, backend: str
) -> None:
    for result in pool2.run(_exchange, backend, False, 4096, 4, timeout=180):
        assert result == {"kind": "python", "exact": True, "code": 0}


#: Host-written commands a kernel's own checks would refuse; the proxy must refuse them too.
#: (opcode, peer, dst_offset, src: "buf"/"gone"/int, src_offset, bytes, id, value) -> code
BAD = {
    "peer": ((L.OP_PUT, 5, 0, "buf", 0, 4, -1, -1), L.E_RANK),
    "unregistered": ((L.OP_PUT, 1, 0, 4242, 0, 4, -1, -1), L.E_BUFFER),
    "deregistered": ((L.OP_PUT, 1, 0, "gone", 0, 4, -1, -1), L.E_BUFFER),
    "misaligned": ((L.OP_PUT, 1, 2, "buf", 0, 4, -1, -1), L.E_ALIGN),
    "dst_past_end": ((L.OP_PUT, 1, 60, "buf", 0, 8, -1, -1), L.E_RANGE),
    "src_past_end": ((L.OP_PUT, 1, 0, "buf", 8, 16, -1, -1), L.E_RANGE),
    "negative": ((L.OP_PUT, 1, -4, "buf", 0, 4, -1, -1), L.E_RANGE),
    "signal_id": ((L.OP_SIGNAL, 1, 0, 0, 0, 0, 3, 1), L.E_SIGNAL_ID),
    "counter_id": ((L.OP_PUT, 1, 0, "buf", 0, 4, -1, 9), L.E_COUNTER_ID),
    "barrier_id": ((L.OP_BARRIER, 1, 0, 0, 0, 0, 2, 1), L.E_BARRIER_ID),
    "opcode": ((77, 1, 0, 0, 0, 0, 0, 0), L.E_HANDLE),
}


def _refusals(backend: str, native: bool) -> dict:
    os.environ[SWITCH] = "1" if native else "0"
    try:
        comm = torchcomms.new_comm(backend, torch.device("cpu"), name=unique_name("nat"))
        me = comm.get_rank()
        found: dict[str, list] = {}
        for name, (words, _) in BAD.items():
            win = comm.new_window(torch.zeros(16, dtype=torch.float32))
            handle = win.get_device_window(signal_count=1, counter_count=1)
            device = win._device
            buf = win.register_local_buffer(torch.full((4,), 7.0))
            gone = win.register_local_buffer(torch.ones(4))
            win.deregister_local_buffer(gone)
            if me == 0:
                src = {"buf": buf, "gone": gone}.get(words[3], words[3])
                command = Command(*words[:3], src, *words[4:])  # type: ignore[arg-type]
                ring = CommandRing(words_at(handle, L.STATE_WORDS))
                assert ring.push(command, 10.0) == L.OK
                try:
                    device.flush()  # returns once the proxy stopped (ABORT set)
                    win.check_device_errors()
                    message = ""
                except torchcomms.TorchCommError as exc:
                    message = str(exc)
                found[name] = [
                    device.proxy_kind,
                    device.word(L.ABORT) == L.PROXY_FAILED,
                    message,
                ]
            comm.barrier(False)
            found.setdefault(name, []).append(bool((win.get_tensor() == 0).all()))
            comm.barrier(False)
            win.tensor_deregister()
        comm.finalize()
        return found
    finally:
        os.environ.pop(SWITCH, None)


@needs_cc
@pytest.mark.parametrize("native", [True, False], ids=["c-proxy", "python-proxy"])
def test_a_host_writer_s_bad_command_is_refused_by_either_proxy_before_anything_is_written(
    pool2: RankPool, native: bool
) -> None:
    results = pool2.run(_refusals, "shm", native, timeout=240)
    kind = "native" if native else "python"
    for name, (_, code) in BAD.items():
        proxy, failed, message, untouched = results[0][name]
        assert (proxy, failed, untouched) == (kind, True, True), name
        assert L.ERROR_NAMES[code] in message, (name, message)
        assert results[1][name] == [True], name  # rank 1's window was not written either
