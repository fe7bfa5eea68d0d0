"""The GPU plugins (ncclx, rccl): discovery, refusals and engine mapping without a GPU.

The ``gpu`` class runs on one CUDA device at world size 1 and is skipped elsewhere.
"""

from __future__ import annotations

import math
import time
import types
import uuid
import warnings
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import (
    BackendLoadError,
    BootstrapError,
    CommInputError,
    CommOptions,
    CommStateError,
    RedOpType,
    ReduceOp,
)
from torchcomms_core.engines import nccl_engine as cuda_support
from torchcomms_core.engines.nccl_engine import (
    CudaWork,
    NcclEngineBackend,
    bool_hint,
    resolve_device,
)
from torchcomms_ncclx import NCCLXBackend
from torchcomms_rccl import RCCLBackend
from torchcomms_rccl.backend import NOT_ROCM_REASON

HAS_CUDA = torch.cuda.is_available()
TIMEOUT = timedelta(seconds=60)


def _c10d_type(name: str) -> Any:
    import torch._C._distributed_c10d as c10d

    return getattr(c10d.ReduceOp.RedOpType, name)


@pytest.fixture
def world1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-rank job, as a launcher would describe it."""
    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    monkeypatch.setenv("TORCHCOMM_LOCAL_RANK", "0")


# -- discovery and refusals -------------------------------------------------------------


@pytest.mark.parametrize(
    "name,cls", [("ncclx", NCCLXBackend), ("nccl", NCCLXBackend), ("rccl", RCCLBackend)]
)
def test_backends_resolve_by_entry_point(name: str, cls: type) -> None:
    from torchcomms_core.plugin_host import backends as registry

    entry = registry.entry_points()[name]
    assert entry.distribution == ("torchcomms-rccl" if name == "rccl" else "torchcomms-ncclx")
    assert torchcomms.get_backend_class(name) is cls
    assert cls.devices == ("cuda",)


def test_gpu_plugins_share_the_core_engine_adapter() -> None:
    # That no plugin imports another is the import contract (tests/plugins/test_import_contract.py).
    assert issubclass(NCCLXBackend, NcclEngineBackend)
    assert issubclass(RCCLBackend, NcclEngineBackend)


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without a GPU")
def test_ncclx_reports_no_cuda() -> None:
    ok, reason = NCCLXBackend.is_available()
    assert not ok
    assert reason == "no CUDA device: torch.cuda.is_available() is False"


@pytest.mark.skipif(torch.version.hip is not None, reason="checks the refusal on non-ROCm torch")
def test_rccl_reports_non_rocm_torch() -> None:
    ok, reason = RCCLBackend.is_available()
    assert not ok
    assert reason == NOT_ROCM_REASON
    assert "torch.version.hip is None" in reason and "torchcomms-ncclx" in reason


@pytest.mark.skipif(HAS_CUDA, reason="checks the refusal on a machine without a GPU")
def test_new_comm_ncclx_fails_fast_without_cuda(world1: None) -> None:
    start = time.monotonic()
    with pytest.raises(BackendLoadError, match="no CUDA device"):
        torchcomms.new_comm("ncclx", torch.device("cuda"))
    assert time.monotonic() - start < 3.0


@pytest.mark.skipif(torch.version.hip is not None, reason="checks the refusal on non-ROCm torch")
def test_new_comm_rccl_refuses_non_rocm_torch(world1: None) -> None:
    with pytest.raises(BackendLoadError, match="needs a ROCm build of PyTorch"):
        torchcomms.new_comm("rccl", torch.device("cuda"))


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


def test_rccl_is_available_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = RCCLBackend.is_available()
    assert not ok and "no ROCm GPU" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert RCCLBackend.is_available() == (True, "ok")


def test_capabilities() -> None:
    assert torch.int16 not in NCCLXBackend.supported_dtypes  # NCCL has no int16
    assert {RedOpType.AVG, RedOpType.PREMUL_SUM} <= NCCLXBackend.supported_reduce_ops
    support = torchcomms.method_support(NCCLXBackend)
    assert support["split"] == "native" and support["abort"] == "native"
    assert support["all_gather_v"] == "native" and support["reduce_scatter_v"] == "native"
    assert NCCLXBackend.coalesce_p2p and RCCLBackend.coalesce_p2p


# -- device resolution and hints --------------------------------------------------------


def _clear_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchcomms_core.foundation import env as _env

    for var in _env.LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)


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


class FakeWork:
    def __init__(self, log: list[tuple[Any, ...]], op: str) -> None:
        self.log, self.op = log, op
        self.done = False

    def wait(self, *timeout: Any) -> bool:
        self.log.append(("wait", self.op, timeout))
        return True

    def is_completed(self) -> bool:
        return self.done


class FakeEngine:
    """Records calls; at world size 1 its results are what NCCL would compute."""

    supports_splitting = True
    created: list[FakeEngine] = []

    class Options:
        def __init__(self) -> None:
            self._timeout: timedelta | None = None
            self.is_high_priority_stream = False
            self.global_ranks_in_group: list[int] = []
            self.group_name = ""
            self.split_from: Any = None
            self.split_color = -2
            # torch's NCCLConfig binds these four fields on every NCCL version.
            self.config = types.SimpleNamespace(
                blocking=1, cga_cluster_size=0, min_ctas=0, max_ctas=0
            )

    def __init__(self, store: Any, rank: int, size: int, opts: Options) -> None:
        self.rank, self.size, self.opts = rank, size, opts
        self.log: list[tuple[Any, ...]] = []
        self.peer_rows: torch.Tensor | None = None  # what other ranks contribute
        FakeEngine.created.append(self)

    def _work(self, op: str, *args: Any) -> FakeWork:
        self.log.append((op, *args))
        return FakeWork(self.log, op)

    def eager_connect_single_device(self, device: torch.device) -> None:
        self.log.append(("eager", device))

    def perform_nocolor_split(self, device: torch.device) -> FakeWork:
        return self._work("nocolor_split", device)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> FakeWork:
        return self._work("allreduce", opts.reduceOp)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> FakeWork:
        return self._work("reduce", opts.reduceOp)

    def reduce_scatter(
        self, outs: list[torch.Tensor], ins: list[list[torch.Tensor]], opts: Any
    ) -> FakeWork:
        return self._work("reduce_scatter", opts.reduceOp, ins[0])

    def allgather(
        self, outs: list[list[torch.Tensor]], ins: list[torch.Tensor], opts: Any
    ) -> FakeWork:
        return self._work("allgather", [t.numel() for t in outs[0]])

    def _allgather_base(self, out: torch.Tensor, inp: torch.Tensor, opts: Any) -> FakeWork:
        rows = out.view(self.size, -1)
        rows[self.rank].copy_(inp.view(-1))
        if self.peer_rows is not None:
            for r in range(self.size):
                if r != self.rank:
                    rows[r].copy_(self.peer_rows[r])
        return self._work("_allgather_base")

    def barrier(self, opts: Any) -> FakeWork:
        return self._work("barrier", list(opts.device_ids))

    def send(self, tensors: list[torch.Tensor], peer: int, tag: int) -> None:
        self.log.append(("send", peer))

    def recv(self, tensors: list[torch.Tensor], peer: int, tag: int) -> None:
        self.log.append(("recv", peer))

    def _start_coalescing(self, device: torch.device) -> None:
        self.log.append(("start_coalescing", device))

    def _end_coalescing(self, device: torch.device) -> FakeWork:
        return self._work("end_coalescing", device)

    def abort(self) -> None:
        self.log.append(("abort",))

    def shutdown(self) -> None:
        self.log.append(("shutdown",))


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Two visible 'GPUs' and a recording engine; returns the ``set_device`` calls."""
    FakeEngine.created.clear()
    bound: list[Any] = []
    monkeypatch.setattr(NCCLXBackend, "engine_class", classmethod(lambda cls: FakeEngine))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    _clear_local_rank(monkeypatch)
    return bound


def _options(rank: int = 1, size: int = 2, **hints: str) -> CommOptions:
    return CommOptions(
        timeout=TIMEOUT, store=object(), name="c", hints=dict(hints), rank=rank, size=size
    )


def _backend(fake_gpu: list[Any], rank: int = 1, size: int = 2, **hints: str) -> NCCLXBackend:
    b = NCCLXBackend()
    options = _options(rank, size, **hints)
    b._bind(torch.device("cuda"), "c", options)
    b.init(torch.device("cuda"), "c", options)
    return b


def _on_cpu(b: NCCLXBackend) -> FakeEngine:
    # Collectives below use CPU tensors; the backend only hands them to the engine.
    b.device = torch.device("cpu", 0)
    return b.engine


def test_init_binds_device_and_connects_eagerly(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu, rank=1, **{"ncclx.high_priority_stream": "true"})
    engine = b.engine
    assert b.device == torch.device("cuda", 1)  # rank 1 of 2 GPUs, no launcher local rank
    assert fake_gpu == [torch.device("cuda", 1)]
    assert engine.log[0] == ("eager", torch.device("cuda", 1))
    assert engine.opts._timeout == TIMEOUT
    assert engine.opts.is_high_priority_stream is True
    assert engine.opts.global_ranks_in_group == [0, 1]
    assert engine.opts.split_from is None
    assert b.get_backend_name() == "ncclx"


def test_the_reference_hints_reach_the_engine(fake_gpu: list[Any]) -> None:
    """The reference's current scheme: config fields by their own names, NCCLX keys."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the current scheme warns about nothing
        b = _backend(
            fake_gpu,
            **{
                "is_high_priority_stream": "true",
                "cgaClusterSize": "4",
                "max_ctas": "16",
                "max_event_pool_size": "32",
                "persistent_store": "true",
                "garbage_collect_interval_ms": "250",
                "enable_cuda_graph_support": "false",
                "graph_timeout_check_interval_ms": "5000",
            },
        )
    opts = b.engine.opts
    assert opts.is_high_priority_stream is True
    assert (opts.config.cga_cluster_size, opts.config.max_ctas) == (4, 16)
    assert opts.config.blocking == 1  # fields no hint names keep NCCL's defaults
    assert b.max_event_pool_size == 32
    assert b.settings is not None
    assert (
        b.settings.garbage_collect_interval_ms,
        b.settings.enable_cuda_graph_support,
        b.settings.graph_timeout_check_interval_ms,
    ) == (250, False, 5000)
    plain = _backend(fake_gpu)
    assert plain.engine.opts.is_high_priority_stream is False
    assert plain.max_event_pool_size == 1000
    assert plain.settings is not None and plain.settings.enable_cuda_graph_support is True
    with pytest.raises(CommInputError, match="has no 'net_name'"):
        _backend(fake_gpu, netName="IB")  # a field this build lacks
    with pytest.raises(CommInputError, match="graph_timeout_check_interval_ms"):
        _backend(fake_gpu, graph_timeout_check_interval_ms="soon")
    with pytest.raises(CommInputError, match="not a boolean"):
        _backend(fake_gpu, enable_cuda_graph_support="maybe")


def test_the_prefixed_config_form_still_works_with_a_deprecation(fake_gpu: list[Any]) -> None:
    with pytest.warns(DeprecationWarning, match="'ncclx::cgaClusterSize'.*pass 'cgaClusterSize'"):
        b = _backend(fake_gpu, **{"ncclx::cgaClusterSize": "2", "blocking": "0"})
    assert (b.engine.opts.config.cga_cluster_size, b.engine.opts.config.blocking) == (2, 0)


def test_ncclx_hints_are_kept_and_reported_not_applied(fake_gpu: list[Any]) -> None:
    from torchcomms_ncclx.hints import NcclxHintWarning

    with pytest.warns(NcclxHintWarning, match="'ncclx::fastInitMode'.*no effect"):
        b = _backend(fake_gpu, **{"ncclx::fastInitMode": "ring_hybrid", "minCTAs": "2"})
    assert b.ncclx_hints == {"ncclx::fastInitMode": "ring_hybrid"}
    assert b.engine.opts.config.min_ctas == 2
    for derived in ("ncclx::commDesc", "ncclx::splitGroupRanks"):
        with pytest.raises(CommInputError, match=f"{derived}.*must not be set"):
            _backend(fake_gpu, **{derived: "x"})


def test_init_refuses_bad_hints(fake_gpu: list[Any]) -> None:
    with pytest.raises(CommInputError, match="unknown hint 'ncclx.high_prio'"):
        _backend(fake_gpu, **{"ncclx.high_prio": "true"})
    with pytest.raises(CommInputError, match="not a boolean"):
        _backend(fake_gpu, **{"ncclx.high_priority_stream": "sometimes"})
    _backend(fake_gpu, **{"other.thing": "x"})  # other namespaces are not ours to judge


def test_sync_collective_orders_the_stream_without_host_wait(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    assert b.all_reduce(torch.ones(4), ReduceOp.SUM, False, timeout=TIMEOUT) is None
    # wait() without a timeout: c10d's NCCL work then only makes the current stream wait.
    assert engine.log[-1] == ("wait", "allreduce", ())


def test_async_work_waits_on_stream_and_blocks_only_on_request(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    work = b.all_reduce(torch.ones(4), ReduceOp.SUM, True, timeout=TIMEOUT)
    assert isinstance(work, CudaWork) and not work.is_completed()
    work.wait()
    assert engine.log[-1] == ("wait", "allreduce", ())
    work.wait_blocking()
    assert engine.log[-1] == ("wait", "allreduce", (TIMEOUT,))


def test_reduce_ops_map_onto_c10d(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    b.all_reduce(torch.ones(4), ReduceOp.AVG, False, timeout=TIMEOUT)
    assert engine.log[-2][1].op == _c10d_type("AVG")
    b.all_reduce(torch.ones(4, dtype=torch.bool), ReduceOp.AVG, False, timeout=TIMEOUT)
    assert engine.log[-2][1].op == _c10d_type("MAX")  # the mean of bools, cast back, is "any"
    b.all_reduce(torch.ones(4), ReduceOp.PREMUL_SUM(0.5), False, timeout=TIMEOUT)
    assert engine.log[-2][1].op == _c10d_type("PREMUL_SUM")
    b.reduce(torch.ones(4), 0, ReduceOp.MIN, False, timeout=TIMEOUT)
    assert engine.log[-2][0] == "reduce" and engine.log[-2][1].op == _c10d_type("MIN")


def test_tensor_premul_factor_lives_until_wait(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    _on_cpu(b)
    factor = torch.tensor([2.0], dtype=torch.float64)
    work = b.all_reduce(
        torch.ones(4, dtype=torch.bfloat16), ReduceOp.PREMUL_SUM(factor), True, timeout=TIMEOUT
    )
    kept = work._keep
    assert isinstance(kept, torch.Tensor) and kept.dtype == torch.bfloat16  # NCCL reads it so
    work.wait()
    assert work._keep is None


def test_integer_premul_sum_scales_then_sums(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    t = torch.tensor([1, 2, 3], dtype=torch.int32)
    b.all_reduce(t, ReduceOp.PREMUL_SUM(3.0), False, timeout=TIMEOUT)
    assert t.tolist() == [3, 6, 9]
    assert engine.log[-2][1].op == _c10d_type("SUM")
    src = torch.tensor([1, 2], dtype=torch.int64)
    b.reduce_scatter(
        torch.empty(2, dtype=torch.int64),
        [src, src],
        ReduceOp.PREMUL_SUM(2.0),
        False,
        timeout=TIMEOUT,
    )
    assert src.tolist() == [1, 2]  # inputs belong to the caller: scaled out of place
    assert engine.log[-2][2][0].tolist() == [2, 4]


def test_bitwise_reductions_gather_and_reduce_locally(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu, rank=1)
    engine = _on_cpu(b)
    engine.peer_rows = torch.tensor([[0b1100, 0b1010], [0, 0]], dtype=torch.int32)
    t = torch.tensor([0b1010, 0b0110], dtype=torch.int32)
    b.all_reduce(t, ReduceOp.BAND, False, timeout=TIMEOUT)
    assert t.tolist() == [0b1000, 0b0010]
    assert not any(entry[0] == "allreduce" for entry in engine.log)
    t = torch.tensor([0b0001, 0b0001], dtype=torch.int32)
    work = b.all_reduce(t, ReduceOp.BXOR, True, timeout=TIMEOUT)
    work.wait()
    assert t.tolist() == [0b1101, 0b1011]


def test_uneven_gather_and_reduce_scatter_are_native(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    b.all_gather_v([torch.empty(3), torch.empty(5)], torch.ones(5), False, timeout=TIMEOUT)
    assert engine.log[-2] == ("allgather", [3, 5])
    b.reduce_scatter_v(
        torch.empty(5), [torch.ones(3), torch.ones(5)], ReduceOp.SUM, False, timeout=TIMEOUT
    )
    assert engine.log[-2][0] == "reduce_scatter"


def test_batch_p2p_is_coalesced(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = _on_cpu(b)
    ops = [("send", torch.ones(2), 0), ("recv", torch.empty(2), 0)]
    assert b.batch_op_issue(ops, False, timeout=TIMEOUT) is None
    names = [entry[0] for entry in engine.log[1:]]
    assert names == ["start_coalescing", "send", "recv", "end_coalescing", "wait"]
    assert engine.log[-1] == ("wait", "end_coalescing", ())


def test_barrier_names_the_device(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = b.engine
    b.barrier(False, timeout=TIMEOUT)
    assert engine.log[-2] == ("barrier", [1])


def test_split_uses_nccl_comm_split(fake_gpu: list[Any]) -> None:
    parent = _backend(fake_gpu, rank=1, size=2)
    child_opts = _options(rank=0, size=1)
    child = parent.split([1], "tp", child_opts)
    assert isinstance(child, NCCLXBackend)
    engine = child.engine
    assert engine is not parent.engine
    assert engine.opts.split_from is parent.engine
    assert engine.opts.split_color == 1  # the group's smallest parent rank
    assert engine.opts.global_ranks_in_group == [1]
    assert engine.log[0] == ("eager", torch.device("cuda", 1))
    assert child.get_rank() == 0 and child.get_size() == 1


def test_split_non_member_takes_part_without_color(fake_gpu: list[Any]) -> None:
    parent = _backend(fake_gpu)
    assert parent.split([], "tp", _options(rank=-1, size=0)) is None
    assert parent.engine.log[-1] == ("nocolor_split", torch.device("cuda", 1))
    assert len(FakeEngine.created) == 1


def test_split_falls_back_without_engine_support(
    fake_gpu: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeEngine, "supports_splitting", False)
    parent = _backend(fake_gpu)
    assert parent.split([], "tp", _options(rank=-1, size=0)) is None
    child = parent.split([1], "tp", _options(rank=0, size=1))
    assert child is not None and child.engine.opts.split_from is None


def test_abort_and_finalize_reach_the_engine(fake_gpu: list[Any]) -> None:
    b = _backend(fake_gpu)
    engine = b.engine
    b.abort()
    assert engine.log[-1] == ("abort",) and b.engine is None
    b = _backend(fake_gpu)
    engine = b.engine
    b.finalize()
    assert engine.log[-1] == ("shutdown",)


def test_rccl_shares_the_engine_code(fake_gpu: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RCCLBackend, "engine_class", classmethod(lambda cls: FakeEngine))
    b = RCCLBackend()
    options = _options(**{"rccl.high_priority_stream": "yes"})
    b._bind(torch.device("cuda"), "c", options)
    b.init(torch.device("cuda"), "c", options)
    assert b.get_backend_name() == "rccl"
    assert b.engine.opts.is_high_priority_stream is True
    assert cuda_support.NcclEngineBackend.split is RCCLBackend.split


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


class FakeNcclxEngine(FakeEngine):
    """The recording engine with what torch's ProcessGroupNCCL adds for these methods."""

    comm_ptr = 0xC0FFEE

    def _comm_ptr(self) -> int:
        return self.comm_ptr

    def alltoall_base(
        self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
        opts: Any,
    ) -> FakeWork:  # fmt: skip
        if self.size == 1:
            out.copy_(inp)
        return self._work("alltoall_base", list(out_splits), list(in_splits))


@pytest.fixture
def fake_ncclx(fake_gpu: list[Any], monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    monkeypatch.setattr(NCCLXBackend, "engine_class", classmethod(lambda cls: FakeNcclxEngine))
    return fake_gpu


def test_ncclx_only_methods_need_an_engine() -> None:
    b = NCCLXBackend()  # never initialized
    for call in (
        b.comm_dump,
        b.get_nccl_comm_ptr,
        lambda: b.set_config({}),
        lambda: b.device_alltoallv_single(*[torch.zeros(2, dtype=torch.int64)] * 4, False),
    ):
        with pytest.raises(CommStateError, match="has no engine"):
            call()


def test_comm_dump_and_comm_dump_all(fake_ncclx: list[Any]) -> None:
    import json

    from torchcomms_ncclx import comm_dump_all
    from torchcomms_ncclx.ncclx_only import comm_hash

    b = _backend(fake_ncclx, rank=1, size=2)
    dump = b.comm_dump()
    decoded = {k: json.loads(v) for k, v in dump.items()}  # every value is JSON text
    assert {"commHash", "rank", "nRanks", "localRank", "cudaDev"} <= set(decoded)
    assert json.loads(dump["rank"]) == 1 and json.loads(dump["nRanks"]) == 2
    assert json.loads(dump["commHash"]) == comm_hash("c", [0, 1])
    assert json.loads(dump["commPtr"]) == FakeNcclxEngine.comm_ptr
    assert json.loads(dump["cudaDev"]) == 1
    assert comm_hash("c", [0, 1]) != comm_hash("c", [1])  # a split has its own hash
    every = comm_dump_all()
    assert every[json.loads(dump["commHash"])] == dump
    only = comm_dump_all({"comm_dump::requestFields": "rank;nRanks"})
    assert only[json.loads(dump["commHash"])] == {"rank": "1", "nRanks": "2"}
    with pytest.raises(CommInputError, match="comm_dump::requestFields"):
        comm_dump_all({"comm_dump::other": "x"})
    with pytest.raises(TypeError, match=r"dict\[str, str\]"):
        comm_dump_all(["rank"])  # type: ignore[arg-type]
    b.finalize()
    assert json.loads(dump["commHash"]) not in comm_dump_all()


def test_get_nccl_comm_ptr_is_the_engines_or_says_why_not(
    fake_ncclx: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    b = _backend(fake_ncclx)
    assert b.get_nccl_comm_ptr() == FakeNcclxEngine.comm_ptr
    monkeypatch.setattr(FakeNcclxEngine, "comm_ptr", 0)
    with pytest.raises(CommStateError, match="no NCCL communicator yet"):
        b.get_nccl_comm_ptr()
    monkeypatch.setattr(NCCLXBackend, "engine_class", classmethod(lambda cls: FakeEngine))
    plain = _backend(fake_ncclx)
    with pytest.raises(CommStateError, match=r"does not expose its ncclComm_t"):
        plain.get_nccl_comm_ptr()


def test_set_config_is_refused_with_what_to_do(fake_ncclx: list[Any]) -> None:
    b = _backend(fake_ncclx)
    b.set_config({})  # nothing to change
    with pytest.raises(CommStateError, match=r"ncclx::commSetConfig.*new_comm\('ncclx'"):
        b.set_config({"allreduceAlgo": "ring"})
    with pytest.raises(TypeError, match="must map str to str"):
        b.set_config({"allreduceAlgo": 1})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match=r"dict\[str, str\]"):
        b.set_config("allreduceAlgo=ring")  # type: ignore[arg-type]


def test_device_alltoallv_single_checks_then_runs_the_engine(fake_ncclx: list[Any]) -> None:
    b = _backend(fake_ncclx, rank=0, size=2)
    engine = _on_cpu(b)
    out, inp = torch.zeros(5, 3), torch.ones(4, 3)
    outs, ins = torch.tensor([2, 3]), torch.tensor([1, 3])
    b.device_alltoallv_single(out, inp, outs, ins, False)
    assert ("alltoall_base", [2, 3], [1, 3]) in engine.log
    bad = {
        "int64 tensor": (out, inp, outs.int(), ins),
        "one entry per rank": (out, inp, torch.tensor([5]), ins),
        "sums to 4 rows but output has 5": (out, inp, torch.tensor([1, 3]), ins),
        "negative": (out, inp, outs, torch.tensor([-1, 5])),
        "must be contiguous": (torch.zeros(5, 6)[:, ::2], inp, outs, ins),
        "rows \\(dim 0\\) must be the same size": (torch.zeros(5, 2), inp, outs, ins),
        "dtype": (out.double(), inp, outs, ins),
        "at least one dimension": (torch.zeros(()), inp, outs, ins),
        "is on meta": (out, inp, outs.to("meta"), ins),
    }
    for message, args in bad.items():
        with pytest.raises(CommInputError, match=message):
            b.device_alltoallv_single(*args, False)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        b.device_alltoallv_single(out, inp, [2, 3], ins, False)  # type: ignore[arg-type]


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
