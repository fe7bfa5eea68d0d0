"""The ncclx backend on torch's NCCL engine, checked against a recording stand-in for
``ProcessGroupNCCL`` with two pretend GPUs: init and hints, stream semantics, reduce ops,
uneven collectives, p2p batching, split, abort, and the reference's NCCLX-only methods.

What needs a real GPU is in ``test_gpu_plugins.py`` (its ``gpu`` classes).
"""

from __future__ import annotations

import types
import warnings
from datetime import timedelta
from typing import Any

import pytest
import torch

from torchcomms import CommInputError, CommOptions, CommStateError, ReduceOp
from torchcomms_core.engines.nccl_engine import CudaWork
from torchcomms_ncclx import NCCLXBackend

TIMEOUT = timedelta(seconds=60)


def _c10d_type(name: str) -> Any:
    import torch._C._distributed_c10d as c10d

    return getattr(c10d.ReduceOp.RedOpType, name)


def _clear_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchcomms_core.foundation import env as _env

    for var in _env.LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)


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
