"""One-sided windows (``comm.new_window``) on gloo (shared memory, or the transport) and mpi
(MPI RMA).

gloo ranks are spawned; mpi ranks are started by mpiexec (skipped, with the reason, where
mpiexec or mpi4py is missing). ``gloo_transport`` is gloo with
``TORCHCOMM_WINDOW_TRANSPORT=transport`` (skipped without a transport plugin). Every body runs
at 2 and 4 ranks, and the gloo transport bodies once more across network namespaces.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
import torch
from conftest import mpi_ranks

import torchcomms
from torchcomms_core.bench import netns
from torchcomms_core.testing import RankPool
from torchcomms_core.testing.pool import unique_name

WINDOW_TRANSPORT = "TORCHCOMM_WINDOW_TRANSPORT"
NO_TRANSPORT = None if torchcomms.RdmaTransport.supported() else "no transport plugin installed"


@pytest.fixture(
    params=[
        "gloo-2",
        "gloo-4",
        "gloo_transport-2",
        "gloo_transport-4",
        "gloo_counters-2",
        "mpi-2",
        "mpi-4",
    ]
)
def ranks(request: pytest.FixtureRequest, pool2: RankPool, pool4: RankPool) -> tuple[str, RankPool]:
    """``(backend, pool)``: gloo on the spawned pools, mpi on ranks started by mpiexec."""
    backend, size = request.param.split("-")
    n = int(size)
    if backend in ("gloo_transport", "gloo_counters") and NO_TRANSPORT:
        pytest.skip(
            f"gloo windows over the transport: {NO_TRANSPORT} (pip install torchcomms-nixl)"
        )
    if backend.startswith("gloo"):
        return backend, pool2 if n == 2 else pool4
    return backend, mpi_ranks(n)


# -- bodies (run on every rank) ----------------------------------------------------------


def _comm(backend: str):
    """A communicator; ``gloo_transport`` is gloo whose windows go through the transport,
    ``gloo_counters`` the same on a transport without signals (counters written instead)."""
    os.environ.pop("TORCHCOMM_TRANSPORT", None)
    if backend in ("gloo_transport", "gloo_counters"):
        os.environ[WINDOW_TRANSPORT] = "transport"
        if backend == "gloo_counters":
            _register_transport_without_signals()
            os.environ["TORCHCOMM_TRANSPORT"] = "nixl-counters"
        backend = "gloo"
    else:
        os.environ.pop(WINDOW_TRANSPORT, None)
    return torchcomms.new_comm(backend, torch.device("cpu"), name=unique_name("win"))


def _register_transport_without_signals() -> None:
    """``nixl-counters``: NIXL whose endpoints say they carry no signals, as a spec-1.0
    transport would, so windows write their counters into the peers' memory."""
    from torchcomms_core.comm.transport import register_transport
    from torchcomms_nixl import NixlTransport

    class WithoutSignals(NixlTransport):
        name = "nixl-counters"

        def endpoint(self, device, timeout):
            endpoint = super().endpoint(device, timeout)
            endpoint.supports_signals = False
            return endpoint

    register_transport("nixl-counters", WithoutSignals)


def _signals_received(backend: str) -> tuple[int, int]:
    """Signals and posted writes this process's NIXL agent has taken in (0 off the transport)."""
    if not backend.startswith("gloo_"):
        return 0, 0
    from torchcomms_nixl.agent import agent

    return agent().signals_received, agent().posts_applied


def body_put_signal_then_read(backend: str) -> list[float]:
    comm = _comm(backend)
    before = _signals_received(backend)
    r, n = comm.get_rank(), comm.get_size()
    win = comm.new_window(torch.zeros(16))
    right, left = (r + 1) % n, (r - 1) % n
    win.put(torch.arange(4, dtype=torch.float32) + 100 * r, right, 3, async_op=False)
    win.signal(right, async_op=False)
    win.wait_signal(left, async_op=False)
    got = win.get_tensor().clone()
    expected = torch.zeros(16)
    expected[3:7] = torch.arange(4, dtype=torch.float32) + 100 * left
    assert torch.equal(got, expected), (got, expected)
    # Over the transport, the signal and this small put are its messages, unless it
    # carries none (then they are written into this rank's memory).
    after = _signals_received(backend)
    messages = (after[0] - before[0], after[1] - before[1])
    expected = (1, 1) if backend == "gloo_transport" else (0, 0)
    assert messages == expected, (backend, messages)
    comm.barrier()
    win.tensor_deregister()
    comm.finalize()
    return got.tolist()


def body_many_disjoint_puts(backend: str, per_peer: int) -> None:
    """Every rank writes its own slice of every rank's window, many small puts, async."""
    comm = _comm(backend)
    r, n = comm.get_rank(), comm.get_size()
    buf = torch.zeros(n * per_peer, dtype=torch.int64)
    win = comm.new_window(buf)
    works = []
    for dst in range(n):
        for i in range(per_peer):
            value = torch.tensor([1000 * r + i], dtype=torch.int64)
            works.append(win.put(value, dst, r * per_peer + i, async_op=True))
    for w in works:
        w.wait()
    for dst in range(n):
        win.signal(dst, async_op=False)
    for src in range(n):
        win.wait_signal(src, async_op=False)
    expected = torch.tensor([1000 * src + i for src in range(n) for i in range(per_peer)])
    assert torch.equal(buf, expected), (buf, expected)
    comm.barrier()
    win.tensor_deregister()
    comm.finalize()


def body_out_of_range_refused(backend: str) -> list[str]:
    """Refused puts write nothing: the target's buffer is untouched afterwards."""
    comm = _comm(backend)
    r, n = comm.get_rank(), comm.get_size()
    buf = torch.full((8,), -1.0)
    win = comm.new_window(buf)
    right = (r + 1) % n
    messages = []
    for offset, count in ((6, 4), (-1, 1), (8, 1), (0, 9)):
        try:
            win.put(torch.ones(count), right, offset, async_op=False)
        except torchcomms.CommInputError as exc:
            messages.append(str(exc))
        else:
            raise AssertionError(f"put of {count} at offset {offset} into 8 was accepted")
    for bad, exc_type in (
        (torch.ones(2, dtype=torch.float64), torchcomms.CommInputError),
        (torch.ones(2), torchcomms.CommInputError),
    ):
        dst = right if bad.dtype != torch.float32 else n  # wrong dtype, then rank n
        try:
            win.put(bad, dst, 0, async_op=False)
        except exc_type as exc:
            messages.append(str(exc))
        else:
            raise AssertionError("a bad put was accepted")
    comm.barrier()
    assert torch.equal(buf, torch.full((8,), -1.0)), buf
    win.tensor_deregister()
    comm.finalize()
    return messages


def body_deregister_in_use_refused(backend: str) -> str:
    comm = _comm(backend)
    r, n = comm.get_rank(), comm.get_size()
    win = comm.new_window(torch.zeros(4))
    right, left = (r + 1) % n, (r - 1) % n
    pending = win.wait_signal(left, async_op=True)  # nobody has signalled yet
    try:
        win.tensor_deregister()
    except torchcomms.CommStateError as exc:
        message = str(exc)
    else:
        raise AssertionError("tensor_deregister succeeded with a wait_signal in flight")
    comm.barrier()  # every rank was refused before anyone signals
    win.signal(right, async_op=False)
    pending.wait()
    comm.barrier()
    win.tensor_deregister()
    assert win.get_tensor() is None and win.get_size() == 0
    comm.finalize()
    return message


def body_window_api(backend: str) -> dict:
    """Registration rules, attributes, map_remote_tensor and the new_window hook."""
    comm = _comm(backend)
    r, n = comm.get_rank(), comm.get_size()
    seen = []
    handle = comm.register_pre_hook(lambda name, op_id, args: seen.append(str(name)))
    win = comm.new_window()
    handle.remove()
    assert seen == ["new_window"], seen
    assert win.get_tensor() is None and win.get_size() == 0 and win.dtype is None
    try:
        win.put(torch.ones(1), 0, 0, async_op=False)
    except torchcomms.CommStateError as exc:
        assert "tensor_register" in str(exc)
    else:
        raise AssertionError("put on an unbound window was accepted")
    t = torch.zeros(2, 3, dtype=torch.float64)
    win.tensor_register(t)
    assert win.get_tensor() is t and win.shape == [2, 3] and win.dtype == torch.float64
    assert win.get_size() == 48
    try:
        win.tensor_register(torch.zeros(1))
    except torchcomms.CommStateError:
        pass
    else:
        raise AssertionError("a second tensor_register was accepted")
    access = win.get_attr((r + 1) % n).access_type
    result = {"access": access.name}
    t.fill_(float(r))
    comm.barrier()
    if access is torchcomms.TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED:
        remote = win.map_remote_tensor((r + 1) % n)
        assert torch.equal(remote, torch.full((2, 3), float((r + 1) % n), dtype=torch.float64))
        comm.barrier()
        try:
            win.tensor_deregister()
        except torchcomms.CommStateError as exc:
            result["mapped"] = str(exc)
        del remote
    else:
        try:
            win.map_remote_tensor((r + 1) % n)
        except torchcomms.CommStateError as exc:
            result["map_refused"] = str(exc)
    comm.barrier()
    win.tensor_deregister()
    assert torch.equal(t, torch.full((2, 3), float(r), dtype=torch.float64))  # data kept
    comm.finalize()
    return result


def body_small_and_large_puts_land_in_order(backend: str) -> None:
    """Puts to the same bytes land in the order they were made, small (posted over the
    transport) and large (written) mixed."""
    comm = _comm(backend)
    r, n = comm.get_rank(), comm.get_size()
    right, left = (r + 1) % n, (r - 1) % n
    numel = 64 << 10  # 256 KiB: above what a posted write carries
    win = comm.new_window(torch.zeros(numel))
    win.put(torch.full((4,), 1.0), right, 0, async_op=False)
    win.put(torch.full((numel,), 2.0), right, 0, async_op=False)
    win.signal(right, async_op=False)
    # Not waiting yet: messages arriving now are taken in by the transport's own thread,
    # at its next poll, while a write lands at once (on one host).
    time.sleep(0.2)
    win.wait_signal(left, async_op=False)
    assert bool((win.get_tensor() == 2.0).all()), win.get_tensor()[:8]
    comm.barrier()
    win.put(torch.full((numel,), 3.0), right, 0, async_op=False)
    win.put(torch.full((4,), 4.0), right, 0, async_op=False)
    win.signal(right, async_op=False)
    win.wait_signal(left, async_op=False)
    got = win.get_tensor()
    assert bool((got[:4] == 4.0).all()) and bool((got[4:] == 3.0).all()), got[:8]
    comm.barrier()
    win.tensor_deregister()
    comm.finalize()


def body_signal_timeout(backend: str) -> str:
    comm = _comm(backend)
    r = comm.get_rank()
    win = comm.new_window(torch.zeros(1))
    message = ""
    if r == 0:
        try:
            win.wait_signal(1, async_op=False, timeout=timedelta(seconds=0.5))
        except torchcomms.CommTimeoutError as exc:
            message = str(exc)
    comm.abort() if comm.is_abort_supported() else comm.finalize()
    return message


def body_ranks_that_share_no_memory(mode: str, transport: bool) -> dict:
    """Rank 1 sees none of the others' shared memory, as from another host or container."""
    from torchcomms_gloo import window as gloo_window

    saved = gloo_window.sees_probe, gloo_window.RdmaTransport
    comm = _comm("gloo")
    os.environ[WINDOW_TRANSPORT] = mode
    r, n = comm.get_rank(), comm.get_size()
    if r == 1:
        gloo_window.sees_probe = lambda path, token: False
    if not transport:
        gloo_window.RdmaTransport = type(
            "NoTransport", (), {"supported": staticmethod(lambda: False)}
        )
    try:
        win = comm.new_window(torch.zeros(4))
    except torchcomms.CommStateError as exc:
        comm.finalize()
        return {"error": str(exc)}
    finally:
        gloo_window.sees_probe, gloo_window.RdmaTransport = saved
        os.environ.pop(WINDOW_TRANSPORT, None)
    right, left = (r + 1) % n, (r - 1) % n
    win.put(torch.full((4,), float(r + 1)), right, 0, async_op=False)
    win.signal(right, async_op=False)
    win.wait_signal(left, async_op=False)
    got = win.get_tensor().tolist()
    access = win.get_attr(right).access_type.name
    comm.barrier()
    win.tensor_deregister()
    comm.finalize()
    return {"got": got, "expected": [float(left + 1)] * 4, "access": access}


def _private_dev_shm() -> None:
    """Give this process a /dev/shm of its own, as in a container of its own (needs root)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_rec, ms_private = 0x00020000, 0x4000, 0x40000
    if libc.unshare(clone_newns) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    if libc.mount(b"none", b"/", None, ms_rec | ms_private, None) != 0:
        raise OSError(ctypes.get_errno(), "mount --make-rprivate /")
    if libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0, b"size=64m") != 0:
        raise OSError(ctypes.get_errno(), "mount tmpfs /dev/shm")


def windows_in_namespaces(mode: str, private_shm: bool) -> int:
    """A rank of ``launch_in_namespaces``: the window bodies, here; 0 when every one passes.

    ``mode`` ``transport`` forces the transport; ``auto`` with ``private_shm`` must find that
    the ranks share no memory and choose it by itself.
    """
    if private_shm:
        _private_dev_shm()
    backend = "gloo_transport" if mode == "transport" else "gloo"
    body_put_signal_then_read(backend)
    body_many_disjoint_puts(backend, 8)
    body_small_and_large_puts_land_in_order(backend)
    assert len(body_out_of_range_refused(backend)) == 6
    assert "in use" in body_deregister_in_use_refused(backend)
    result = body_window_api(backend)
    assert result["access"] == "WIN_ACCESS_TYPE_SEPARATE", result
    assert "not directly addressable" in result["map_refused"], result
    assert "timed out" in body_signal_timeout(backend) or comm_rank_is_not_zero()
    return 0


def comm_rank_is_not_zero() -> bool:
    return os.environ.get("TORCHCOMM_RANK", "0") != "0"


# -- tests ---------------------------------------------------------------------------------


def test_put_then_signal_then_wait_signal_sees_the_data(ranks) -> None:
    backend, pool = ranks
    pool.run(body_put_signal_then_read, backend, timeout=60)


def test_small_and_large_puts_to_the_same_bytes_land_in_order(ranks) -> None:
    backend, pool = ranks
    pool.run(body_small_and_large_puts_land_in_order, backend, timeout=60)


def test_many_puts_to_disjoint_offsets_land_exactly(ranks) -> None:
    backend, pool = ranks
    pool.run(body_many_disjoint_puts, backend, 16, timeout=60)


def test_out_of_range_puts_are_refused_before_writing(ranks) -> None:
    backend, pool = ranks
    for messages in pool.run(body_out_of_range_refused, backend, timeout=60):
        assert len(messages) == 6
        assert "do not fit in rank" in messages[0] and "window of 8" in messages[0]
        assert "dtype" in messages[4]


def test_deregister_while_in_use_is_refused(ranks) -> None:
    backend, pool = ranks
    for message in pool.run(body_deregister_in_use_refused, backend, timeout=60):
        assert "in use" in message and "wait()" in message


def test_window_api_attributes_hooks_and_mapping(ranks) -> None:
    backend, pool = ranks
    results = pool.run(body_window_api, backend, timeout=60)
    if backend == "gloo":  # shared memory
        assert all(r["access"] == "WIN_ACCESS_TYPE_UNIFIED" for r in results)
        assert all("map_remote_tensor" in r["mapped"] for r in results)
    else:
        assert all(r["access"] == "WIN_ACCESS_TYPE_SEPARATE" for r in results)
        assert all("not directly addressable" in r["map_refused"] for r in results)


def test_wait_signal_times_out(ranks) -> None:
    backend, pool = ranks
    message = pool.run(body_signal_timeout, backend, timeout=60)[0]
    assert "no signal from rank 1" in message and "timed out" in message


@pytest.mark.skipif(
    NO_TRANSPORT is not None, reason=f"{NO_TRANSPORT} (pip install torchcomms-nixl)"
)
def test_gloo_ranks_that_share_no_memory_use_the_transport(pool2: RankPool) -> None:
    for result in pool2.run(body_ranks_that_share_no_memory, "auto", True, timeout=60):
        assert result["got"] == result["expected"]
        assert result["access"] == "WIN_ACCESS_TYPE_SEPARATE"


def test_gloo_shm_forced_on_ranks_that_share_no_memory_is_refused(pool2: RankPool) -> None:
    for result in pool2.run(body_ranks_that_share_no_memory, "shm", True, timeout=60):
        assert "do not share memory" in result["error"] and "rank(s) [1]" in result["error"]


def test_gloo_windows_without_shared_memory_or_transport_name_what_to_install(
    pool2: RankPool,
) -> None:
    for result in pool2.run(body_ranks_that_share_no_memory, "auto", False, timeout=60):
        message = result["error"]
        assert "do not share memory" in message and "torchcomms-nixl" in message
        assert "mpi backend" in message


def test_window_support_is_reported_by_method_support() -> None:
    from torchcomms_core.spec import TorchCommBackend, method_support

    assert method_support(torchcomms.get_backend_class("gloo"))["new_window"] == "native"
    assert method_support(TorchCommBackend)["new_window"] == "unsupported"


NETNS_REASON = netns.unavailable_reason() or NO_TRANSPORT


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=f"netns windows: {NETNS_REASON}")
@pytest.mark.parametrize("size", [2, 4])
def test_window_semantics_hold_across_network_namespaces(size: int) -> None:
    """The same bodies, each rank a host behind a 1 Gbit/s link, through the transport."""
    with netns.shaped_network(size, "1gbit") as net:
        code = netns.launch_in_namespaces(
            net, windows_in_namespaces, ("transport", False), label="windows"
        )
    assert code == 0


@pytest.mark.netns
@pytest.mark.skipif(NETNS_REASON is not None, reason=f"netns windows: {NETNS_REASON}")
def test_auto_chooses_the_transport_for_ranks_with_their_own_shared_memory() -> None:
    """Same machine, same host name and boot id, but each rank has its own /dev/shm."""
    with netns.shaped_network(2, "1gbit") as net:
        code = netns.launch_in_namespaces(net, windows_in_namespaces, ("auto", True), label="auto")
    assert code == 0
