"""The ncclx backend: discovery, refusals, device resolution and hints without a GPU, and on
one CUDA device at world size 1 (the ``gpu`` classes, skipped elsewhere).

How the backend drives torch's NCCL engine is checked without a GPU against a recording
engine in ``test_ncclx_engine.py``; the rccl backend's tests are in
``plugins/torchcomms_rccl/tests``.
"""

from __future__ import annotations

import math
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import (
    BackendLoadError,
    BootstrapError,
    CommInputError,
    CommStateError,
    RedOpType,
    ReduceOp,
)
from torchcomms_core.engines.nccl_engine import (
    NcclEngineBackend,
    bool_hint,
    resolve_device,
)
from torchcomms_ncclx import NCCLXBackend

HAS_CUDA = torch.cuda.is_available()
TIMEOUT = timedelta(seconds=60)


@pytest.fixture
def world1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-rank job, as a launcher would describe it."""
    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    monkeypatch.setenv("TORCHCOMM_LOCAL_RANK", "0")


def _clear_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchcomms_core.foundation import env as _env

    for var in _env.LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("name", ["ncclx", "nccl"])
def test_backends_resolve_by_entry_point(name: str) -> None:
    from torchcomms_core.plugin_host import backends as registry

    entry = registry.entry_points()[name]
    assert entry.distribution == "torchcomms-ncclx"
    assert torchcomms.get_backend_class(name) is NCCLXBackend
    assert NCCLXBackend.devices == ("cuda",)


def test_ncclx_is_the_core_engine_adapter() -> None:
    # rccl's own tests (plugins/torchcomms_rccl/tests) check that it shares the adapter too.
    assert issubclass(NCCLXBackend, NcclEngineBackend)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without a GPU")
def test_ncclx_reports_no_cuda() -> None:
    ok, reason = NCCLXBackend.is_available()
    assert not ok
    assert reason == "no CUDA device: torch.cuda.is_available() is False"


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without a GPU")
def test_new_comm_ncclx_fails_fast_without_cuda(world1: None) -> None:
    start = time.monotonic()
    with pytest.raises(BackendLoadError, match="no CUDA device"):
        torchcomms.new_comm("ncclx", torch.device("cuda"))
    assert time.monotonic() - start < 3.0


def test_new_comm_ncclx_refuses_cpu_device(world1: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # As on a GPU machine: the backend could run, but the device type is wrong.
    monkeypatch.setattr(NCCLXBackend, "is_available", classmethod(lambda cls: (True, "ok")))
    with pytest.raises(CommInputError, match="cuda") as info:
        torchcomms.new_comm("ncclx", torch.device("cpu"))
    assert "'cpu'" in str(info.value)


def test_ncclx_is_available_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    assert NCCLXBackend.is_available() == (False, "this PyTorch build has no NCCL")
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert NCCLXBackend.is_available() == (True, "ok")
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    ok, reason = NCCLXBackend.is_available()
    assert not ok and "ROCm" in reason and "torchcomms-rccl" in reason


def test_capabilities() -> None:
    assert torch.int16 not in NCCLXBackend.supported_dtypes  # NCCL has no int16
    assert {RedOpType.AVG, RedOpType.PREMUL_SUM} <= NCCLXBackend.supported_reduce_ops
    support = torchcomms.method_support(NCCLXBackend)
    assert support["split"] == "native" and support["abort"] == "native"
    assert support["all_gather_v"] == "native" and support["reduce_scatter_v"] == "native"
    assert NCCLXBackend.coalesce_p2p


# -- device resolution and hints --------------------------------------------------------


def test_device_index_from_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_local_rank(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device(torch.device("cuda"), rank=11, device_count=8) == torch.device("cuda", 3)


def test_device_index_without_launcher_uses_rank_modulo(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_local_rank(monkeypatch)
    assert resolve_device(torch.device("cuda"), rank=5, device_count=4) == torch.device("cuda", 1)


def test_explicit_device_index_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert resolve_device(torch.device("cuda", 2), rank=0, device_count=4) == torch.device(
        "cuda", 2
    )


def test_device_errors_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear_local_rank(monkeypatch)
    monkeypatch.setenv("LOCAL_RANK", "4")
    with pytest.raises(CommInputError, match=r"local rank 4 \(from LOCAL_RANK\) has no GPU"):
        resolve_device(torch.device("cuda"), rank=4, device_count=2)
    with pytest.raises(CommInputError, match="does not exist"):
        resolve_device(torch.device("cuda", 7), rank=0, device_count=2)
    with pytest.raises(CommInputError, match="no CUDA device"):
        resolve_device(torch.device("cuda"), rank=0, device_count=0)
    with pytest.raises(CommInputError, match="expected a CUDA device"):
        resolve_device(torch.device("cpu"), rank=0, device_count=2)
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(BootstrapError, match="LOCAL_RANK='x'"):
        resolve_device(torch.device("cuda"), rank=0, device_count=2)


def test_bool_hints() -> None:
    hints = {"ncclx.a": "TRUE", "ncclx.b": "off", "ncclx.c": "maybe"}
    assert bool_hint(hints, "ncclx.a", False) is True
    assert bool_hint(hints, "ncclx.b", True) is False
    assert bool_hint(hints, "ncclx.missing", True) is True
    with pytest.raises(CommInputError, match="ncclx.c='maybe' is not a boolean"):
        bool_hint(hints, "ncclx.c", False)


# -- the engine mapping, on a recording stand-in for ProcessGroupNCCL ---------------------


# -- on a GPU (world size 1) --------------------------------------------------------------

# About a second of GPU time on an H200 (clock64 cycles at ~2 GHz).
SLEEP_CYCLES = 2_000_000_000


@pytest.fixture(scope="class")
def store() -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, 1, True, timeout=TIMEOUT, wait_for_workers=False)


@pytest.fixture
def comm(world1: None, store: Any) -> Any:
    c = torchcomms.new_comm(
        "ncclx",
        torch.device("cuda"),
        name=f"gpu_{uuid.uuid4().hex[:8]}",
        store=store,
        timeout=TIMEOUT,
    )
    yield c
    if not (c.is_finalized() or c.is_aborted()):
        c.finalize()


def _after_sleep() -> torch.cuda.Event:
    """Queue a long kernel on the current stream; the returned event fires after it."""
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP_CYCLES)
    event = torch.cuda.Event()
    event.record()
    return event


def _all(t: torch.Tensor, value: float) -> bool:
    return bool(torch.all(t == value).item())


@pytest.mark.gpu
@pytest.mark.skipif(
    not HAS_CUDA,
    reason="needs a CUDA device (torch.cuda.is_available() is "
    "False); run scripts/gpu_checks.sh on a GPU machine",
)
class TestOnGPU:
    """World size 1 on ``cuda:0``: NCCL runs its local path; semantics are what we check."""

    def test_comm_is_ready_and_bound(self, comm: Any) -> None:
        assert comm.get_backend() == "ncclx" and comm.get_size() == 1
        backend = comm.get_backend_impl()
        assert backend.device == torch.device("cuda", 0)
        assert torch.cuda.current_device() == 0
        print(f"NCCL version {NCCLXBackend.nccl_version()}")

    def test_every_collective(self, comm: Any) -> None:
        dev = torch.device("cuda", 0)
        x = torch.arange(8, dtype=torch.float32, device=dev)

        def fresh() -> torch.Tensor:
            return x.clone()

        for op in (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVG):
            t = fresh()
            comm.all_reduce(t, op, async_op=False)
            assert torch.equal(t, x), op
        t = fresh()
        comm.all_reduce(t, ReduceOp.PREMUL_SUM(2.0), async_op=False)
        assert torch.equal(t, x * 2)
        t = fresh()
        comm.all_reduce(t, ReduceOp.PREMUL_SUM(torch.tensor(3.0, device=dev)), async_op=False)
        assert torch.equal(t, x * 3)
        t = fresh().view(2, 4).t()  # non-contiguous: the core copies in and back
        comm.all_reduce(t, ReduceOp.PREMUL_SUM(0.5), async_op=False)
        assert torch.equal(t, (x * 0.5).view(2, 4).t())
        ints = torch.tensor([0b1010, 7, -3], dtype=torch.int32, device=dev)
        for op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, ReduceOp.AVG):
            t = ints.clone()
            comm.all_reduce(t, op, async_op=False)
            assert torch.equal(t, ints), op
        t = ints.clone()
        comm.all_reduce(t, ReduceOp.PREMUL_SUM(2.0), async_op=False)
        assert torch.equal(t, ints * 2)
        flags = torch.tensor([True, False], device=dev)
        comm.all_reduce(flags, ReduceOp.AVG, async_op=False)
        assert flags.tolist() == [True, False]

        t = fresh()
        comm.broadcast(t, 0, async_op=False)
        assert torch.equal(t, x)
        t = fresh()
        comm.reduce(t, 0, ReduceOp.AVG, async_op=False)
        assert torch.equal(t, x)
        out = [torch.empty_like(x)]
        comm.all_gather(out, x, async_op=False)
        assert torch.equal(out[0], x)
        out = [torch.empty_like(x)]
        comm.all_gather_v(out, x, async_op=False)
        assert torch.equal(out[0], x)
        single = torch.empty_like(x)
        comm.all_gather_single(single, x, async_op=False)
        assert torch.equal(single, x)
        o = torch.empty_like(x)
        comm.reduce_scatter(o, [x], ReduceOp.SUM, async_op=False)
        assert torch.equal(o, x)
        o = torch.empty_like(x)
        comm.reduce_scatter_v(o, [x], ReduceOp.PREMUL_SUM(0.5), async_op=False)
        assert torch.equal(o, x * 0.5)
        o = torch.empty_like(x)
        comm.reduce_scatter_single(o, x, ReduceOp.MAX, async_op=False)
        assert torch.equal(o, x)
        o = torch.empty_like(ints)
        comm.reduce_scatter_single(o, ints, ReduceOp.BOR, async_op=False)
        assert torch.equal(o, ints)
        out = [torch.empty_like(x)]
        comm.all_to_all(out, [x], async_op=False)
        assert torch.equal(out[0], x)
        o = torch.empty_like(x)
        comm.all_to_all_single(o, x, async_op=False)
        assert torch.equal(o, x)
        o = torch.empty_like(x)
        comm.all_to_all_v_single(o, x, [8], [8], async_op=False)
        assert torch.equal(o, x)
        comm.barrier(async_op=False)
        o = torch.empty_like(x)
        comm.scatter(o, [x], 0, async_op=False)
        assert torch.equal(o, x)
        out = [torch.empty_like(x)]
        comm.gather(out, x, 0, async_op=False)
        assert torch.equal(out[0], x)
        o = torch.empty_like(x)
        comm.gather_single(o, x, 0, async_op=False)
        assert torch.equal(o, x)

    def test_unsupported_dtype_is_refused_before_communication(self, comm: Any) -> None:
        with pytest.raises(CommInputError, match="int16"):
            comm.all_reduce(torch.ones(4, dtype=torch.int16, device="cuda"), ReduceOp.SUM)
        t = torch.ones(4, device="cuda")
        comm.all_reduce(t, ReduceOp.SUM)  # still usable
        assert _all(t, 1.0)

    def test_sync_does_not_block_the_host(self, comm: Any) -> None:
        x = torch.ones(1 << 22, device="cuda")
        after_sleep = _after_sleep()
        start = time.perf_counter()
        comm.all_reduce(x, ReduceOp.PREMUL_SUM(2.0), async_op=False)
        elapsed = time.perf_counter() - start
        host_was_free = not after_sleep.query()
        y = x + 0  # queued on the current stream: must see the reduced values
        torch.cuda.synchronize()
        assert host_was_free, (
            f"all_reduce(async_op=False) returned after the GPU caught up "
            f"({elapsed:.3f} s): it blocked the host"
        )
        assert _all(y, 2.0), "the current stream did not wait for the collective"
        print(f"sync all_reduce returned in {elapsed * 1e3:.2f} ms while the GPU was busy")

    def test_async_then_wait(self, comm: Any) -> None:
        x = torch.ones(1 << 22, device="cuda")
        after_sleep = _after_sleep()
        work = comm.all_reduce(x, ReduceOp.PREMUL_SUM(2.0), async_op=True)
        assert not work.is_completed()
        work.wait()
        host_was_free = not after_sleep.query()
        y = x + 0
        torch.cuda.synchronize()
        assert host_was_free, "work.wait() blocked the host; it should only order the stream"
        assert _all(y, 2.0)
        assert work.is_completed()

    def test_wait_blocking_blocks_the_host(self, comm: Any) -> None:
        x = torch.ones(1024, device="cuda")
        backend = comm.get_backend_impl()
        after_sleep = _after_sleep()
        inner = backend.all_reduce(x, ReduceOp.SUM, True, timeout=TIMEOUT)
        inner.wait_blocking()
        assert after_sleep.query(), "the backend's wait_blocking() returned before completion"
        after_sleep = _after_sleep()
        work = comm.all_reduce(x, ReduceOp.SUM, async_op=True)
        work.wait_blocking()
        done = after_sleep.query()
        torch.cuda.synchronize()
        assert done, "TorchWork.wait_blocking() returned before the operation completed"

    def test_async_keeps_tensors_alive(self, comm: Any) -> None:
        n = 1 << 24
        x = torch.ones(n, device="cuda")
        _after_sleep()
        work = comm.all_reduce(x, ReduceOp.PREMUL_SUM(2.0), async_op=True)
        del x  # the caller lets go; the engine must not let the allocator reuse it
        others = [torch.full((n,), 7.0, device="cuda") for _ in range(4)]
        work.wait()
        torch.cuda.synchronize()
        assert all(_all(o, 7.0) for o in others), "a buffer in flight was reused"

    def test_split(self, comm: Any) -> None:
        engine = comm.get_backend_impl().engine
        before = engine.comm_split_count()
        sub = comm.split([0], "sub")
        assert sub is not None and sub.get_size() == 1 and sub.get_rank() == 0
        assert engine.comm_split_count() == before + 1, "the child was not made by ncclCommSplit"
        t = torch.ones(16, device="cuda")
        sub.all_reduce(t, ReduceOp.SUM)
        assert _all(t, 1.0)
        sub.finalize()
        start = time.monotonic()
        assert comm.split([], "nobody") is None  # NCCL's no-color split must not hang
        assert time.monotonic() - start < 30

    def test_abort(self, comm: Any) -> None:
        t = torch.ones(16, device="cuda")
        comm.all_reduce(t, ReduceOp.SUM)
        assert comm.is_abort_supported()
        comm.abort()
        assert comm.is_aborted()
        with pytest.raises(CommStateError, match="aborted"):
            comm.all_reduce(t, ReduceOp.SUM)

    def test_cuda_graph_capture(self, comm: Any) -> None:
        x = torch.ones(1024, device="cuda")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the capture, as CUDA graphs require
            for _ in range(2):
                comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        torch.cuda.current_stream().wait_stream(side)
        # Let the engine's watchdog retire the warm-up works: it must not query their
        # events while the capture is under way.
        torch.cuda.synchronize()
        time.sleep(0.2)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            x.mul_(2)
            comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        x.fill_(1.0)
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        assert _all(x, 8.0)

    def test_hints(self, world1: None, store: Any) -> None:
        comm = torchcomms.new_comm(
            "ncclx",
            torch.device("cuda"),
            name=f"hints_{uuid.uuid4().hex[:8]}",
            store=store,
            timeout=TIMEOUT,
            hints={"ncclx.high_priority_stream": "true", "ncclx.register_memory": "true"},
        )
        try:
            backend = comm.get_backend_impl()
            assert backend.mem_pool is not None
            with torch.cuda.use_mem_pool(backend.mem_pool):
                t = torch.ones(1 << 20, device="cuda")
            comm.all_reduce(t, ReduceOp.PREMUL_SUM(2.0))
            assert _all(t, 2.0)
            assert backend.get_mem_allocator() is not None
        finally:
            comm.finalize()

    def test_bandwidth(self, comm: Any, record_property: Any) -> None:
        """Times all_reduce and all_gather at 1 and 256 MiB; the figures are reported, and
        checked only for sense (speed goals belong to ``torchcomms bench``)."""
        from torchcomms_core.bench.ops import OPS
        from torchcomms_core.bench.results import Row, Timing

        size = comm.get_size()
        for mib in (1, 256):
            n = mib * (1 << 20) // 4
            x = torch.empty(n, device="cuda")
            out = torch.empty(n * size, device="cuda")
            iters = 50 if mib == 1 else 10
            for name, op in (("all_reduce", "all_reduce"), ("all_gather", "all_gather_single")):
                x.fill_(1.0)
                out.fill_(-1.0)
                ms = _time_per_op(comm, name, x, out, iters)
                assert math.isfinite(ms) and ms > 0, f"{name} {mib} MiB: timed {ms} ms per op"
                runs = _WARMUP + iters
                if name == "all_reduce":  # a SUM of ones, repeated: size ** runs
                    expected_x, expected_out = float(size) ** runs, -1.0
                else:
                    expected_x, expected_out = 1.0, 1.0
                assert _all(x, expected_x), f"{name} {mib} MiB: wrong input after timing"
                assert _all(out, expected_out), f"{name} {mib} MiB: wrong output after timing"
                largest = (n if name == "all_reduce" else n * size) * 4
                row = Row(
                    op=op,
                    size=largest,
                    count=largest // 4,
                    dtype="float32",
                    redop="sum",
                    root=0,
                    nranks=size,
                    busbw_factor=OPS[op].busbw_factor(size),
                )
                timing = Timing([ms * 1e3])
                algbw, busbw = row.algbw(timing), row.busbw(timing)
                assert algbw is not None and math.isfinite(algbw) and algbw > 0, algbw
                # The bus carries nothing at world size 1 (factor 0): busbw is 0 there.
                assert busbw is not None and math.isfinite(busbw) and busbw >= 0, busbw
                assert (busbw > 0) == (size > 1), (busbw, size)
                record_property(f"{name}_{mib}MiB_algbw_gbps", round(algbw, 3))
                record_property(f"{name}_{mib}MiB_busbw_gbps", round(busbw, 3))
                print(
                    f"\nbandwidth {name} {mib} MiB: {ms:.3f} ms/op, {algbw:.1f} GB/s algbw, "
                    f"{busbw:.1f} GB/s busbw (world size {size}: NCCL's local path, no "
                    f"interconnect)"
                )


#: Untimed calls before the timed ones.
_WARMUP = 3


def _time_per_op(comm: Any, name: str, x: torch.Tensor, out: torch.Tensor, iters: int) -> float:
    """Milliseconds per operation, measured with CUDA events after a warm-up."""

    def run() -> None:
        if name == "all_reduce":
            comm.all_reduce(x, ReduceOp.SUM, async_op=False)
        else:
            comm.all_gather_single(out, x, async_op=False)

    for _ in range(_WARMUP):
        run()
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        run()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


# -- the reference's NCCLX-only methods (torchcomms_ncclx.ncclx_only) -------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not HAS_CUDA,
    reason="needs a CUDA device (torch.cuda.is_available() is "
    "False); run scripts/gpu_checks.sh on a GPU machine",
)
class TestNcclxOnlyOnGPU:
    """The NCCLX-only methods on a real ProcessGroupNCCL at world size 1."""

    def test_comm_dump_split_and_dump_all(self, comm: Any) -> None:
        import json

        from torchcomms_ncclx import comm_dump_all

        backend = comm.get_backend_impl()
        dump = backend.comm_dump()
        assert json.loads(dump["rank"]) == 0 and json.loads(dump["nRanks"]) == 1
        decoded = {k: json.loads(v) for k, v in dump.items()}  # every value is JSON text
        assert decoded["cudaDev"] == 0 and isinstance(decoded["commHash"], str)
        sub = comm.split([0], name="ncclx_only_split")
        sub_dump = sub.get_backend_impl().comm_dump()
        assert sub_dump["commHash"] != dump["commHash"]
        every = comm_dump_all()
        assert json.loads(dump["commHash"]) in every
        assert json.loads(sub_dump["commHash"]) in every
        print(f"\ncomm_dump: {dump}")
        sub.finalize()

    def test_comm_ptr_and_set_config(self, comm: Any) -> None:
        backend = comm.get_backend_impl()
        if getattr(backend.engine, "_comm_ptr", None) is None:
            with pytest.raises(CommStateError, match="does not expose"):
                backend.get_nccl_comm_ptr()
            print("\nget_nccl_comm_ptr: this torch has no ProcessGroupNCCL._comm_ptr")
        else:
            ptr = backend.get_nccl_comm_ptr()
            assert isinstance(ptr, int) and ptr != 0
            print(f"\nget_nccl_comm_ptr: {ptr:#x}")
        backend.set_config({})
        with pytest.raises(CommStateError, match="ncclx::commSetConfig"):
            backend.set_config({"allreduceAlgo": "ring"})

    def test_device_alltoallv_single(self, comm: Any) -> None:
        backend = comm.get_backend_impl()
        dev = torch.device("cuda", 0)
        inp = torch.arange(15, dtype=torch.float32, device=dev).view(5, 3)
        out = torch.zeros(5, 3, device=dev)
        splits = torch.tensor([5], dtype=torch.int64, device=dev)
        backend.device_alltoallv_single(out, inp, splits, splits, False)
        torch.cuda.synchronize()
        assert torch.equal(out, inp)
        out2 = torch.zeros(5, 3, device=dev)
        work = backend.device_alltoallv_single(out2, inp, splits, splits, True)
        work.wait()
        torch.cuda.synchronize()
        assert torch.equal(out2, inp)
        with pytest.raises(CommInputError, match="is on cpu"):
            backend.device_alltoallv_single(out, inp, splits.cpu(), splits, False)
