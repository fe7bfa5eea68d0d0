"""The rccl backend (AMD GPUs on a ROCm build of torch), as far as a machine without one shows it.

Discovery and refusals run against the real installation: the entry point, ``is_available``,
``torchcomms backends`` and ``new_comm``. How the backend reads its hints and sets up
torch's engine runs on a recording stand-in for ``ProcessGroupNCCL`` (RCCL on ROCm builds),
with two pretend GPUs. ``TestOnRocmGPU`` runs a world-size-1 communicator on a ROCm GPU and
is skipped elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
import uuid
from datetime import timedelta
from typing import Any

import pytest
import torch

import torchcomms
from torchcomms import BackendLoadError, CommInputError, CommOptions, ReduceOp
from torchcomms_core.plugin import NcclEngineBackend
from torchcomms_rccl import RCCLBackend
from torchcomms_rccl.backend import NOT_ROCM_REASON

IS_ROCM = torch.version.hip is not None
HAS_ROCM_GPU = IS_ROCM and torch.cuda.is_available()
TIMEOUT = timedelta(seconds=60)


@pytest.fixture
def world1(monkeypatch: pytest.MonkeyPatch) -> None:
    """A single-rank job, as a launcher would describe it."""
    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    monkeypatch.setenv("TORCHCOMM_LOCAL_RANK", "0")


# -- discovery ---------------------------------------------------------------------------


def test_registered_by_its_entry_point() -> None:
    from torchcomms_core.plugin_host import backends as registry

    entry = registry.entry_points()["rccl"]
    assert entry.distribution == "torchcomms-rccl"
    assert entry.value == "torchcomms_rccl:RCCLBackend"
    assert torchcomms.get_backend_class("rccl") is RCCLBackend
    assert "rccl" in torchcomms.available_backends()


def test_version_is_the_cores() -> None:
    import torchcomms_core
    import torchcomms_rccl

    assert torchcomms_rccl.__version__ == torchcomms_core.__version__


def test_rocm_gpus_present_as_cuda_on_the_shared_nccl_engine() -> None:
    assert RCCLBackend.devices == ("cuda",)
    assert issubclass(RCCLBackend, NcclEngineBackend)
    assert RCCLBackend().get_backend_name() == "rccl"
    # The engine code is the core's, not a copy: RCCL runs under ProcessGroupNCCL on ROCm.
    for method in ("init", "split", "all_reduce", "batch_op_issue", "abort"):
        assert getattr(RCCLBackend, method) is getattr(NcclEngineBackend, method), method
    assert "engine_class" not in vars(RCCLBackend)  # torch's ProcessGroupNCCL, as for ncclx


def test_capabilities_and_method_support() -> None:
    assert torch.int16 not in RCCLBackend.supported_dtypes  # RCCL, like NCCL, has no int16
    assert torch.float32 in RCCLBackend.supported_dtypes
    assert torch.bfloat16 in RCCLBackend.supported_dtypes
    assert RCCLBackend.coalesce_p2p
    support = torchcomms.method_support(RCCLBackend)
    # Every operation of the spec is answered, and every collective the engine has is native.
    assert set(support.values()) <= {"native", "derived", "unsupported"}
    for op in (
        "all_reduce",
        "reduce_scatter_v",
        "all_gather_v",
        "all_to_all_v_single",
        "split",
        "abort",
        "batch_op_issue",
    ):
        assert support[op] == "native", op
    # Windows and tagged receives are not what torch's NCCL engine offers.
    for op in ("new_window", "send_tagged", "recv_tagged", "recv_anysource"):
        assert support[op] == "unsupported", op
    # Plugin collectives (torchcomms-quantized) fall back to their portable form here.
    assert support.get("quantized_all_reduce", "derived") == "derived"


def test_hint_keys_are_in_the_rccl_namespace() -> None:
    assert RCCLBackend.hint_prefix == "rccl"
    keys = RCCLBackend.hint_keys
    assert keys is not None
    assert set(keys) == {
        "is_high_priority_stream",
        "max_event_pool_size",
        "persistent_store",
        "rccl::*",
        "rccl.high_priority_stream",
        "rccl.register_memory",
    }
    assert not any(k.startswith(("ncclx", "nccl.", "nccl::")) for k in keys)


# -- refusals on this machine --------------------------------------------------------------


@pytest.mark.skipif(IS_ROCM, reason="checks the refusal on a torch that is not built for ROCm")
def test_is_available_says_why_not_and_what_to_do() -> None:
    ok, reason = RCCLBackend.is_available()
    assert (ok, reason) == (False, NOT_ROCM_REASON)
    assert "torch.version.hip is None" in reason  # why
    assert "install torch for ROCm" in reason and "torchcomms-ncclx" in reason  # what to do


def test_is_available_branches(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    monkeypatch.setattr(torch.version, "hip", None)
    assert RCCLBackend.is_available() == (False, NOT_ROCM_REASON)
    monkeypatch.setattr(torch.version, "hip", "6.4.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    ok, reason = RCCLBackend.is_available()
    assert not ok
    assert "no ROCm GPU" in reason and "HIP_VISIBLE_DEVICES" in reason and "rocm-smi" in reason
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    ok, reason = RCCLBackend.is_available()
    assert not ok and "has no RCCL" in reason and "is_nccl_available() is False" in reason
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    assert RCCLBackend.is_available() == (True, "ok")


@pytest.mark.skipif(IS_ROCM, reason="checks the refusal on a torch that is not built for ROCm")
@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_new_comm_refuses_at_once_naming_the_fix(world1: None, device: str) -> None:
    start = time.monotonic()
    with pytest.raises(BackendLoadError) as info:
        torchcomms.new_comm("rccl", torch.device(device))
    assert time.monotonic() - start < 5.0  # refused before any rendezvous
    text = str(info.value)
    assert text.startswith("new_comm: backend 'rccl' cannot run here: ")
    assert NOT_ROCM_REASON in text


@pytest.mark.skipif(IS_ROCM, reason="checks the listing on a torch that is not built for ROCm")
def test_torchcomms_backends_lists_it_with_the_reason() -> None:
    # A fresh interpreter: what a user running `torchcomms backends` sees.
    run = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "backends", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(run.stdout)}
    row = rows["rccl"]
    assert row["distribution"] == "torchcomms-rccl"
    assert row["entry_point"] == "torchcomms_rccl:RCCLBackend"
    assert (row["broken"], row["runnable"]) == (False, False)
    assert row["reason"] == NOT_ROCM_REASON
    assert row["devices"] == ["cuda"]
    assert "all_reduce" in row["native"] and "split" in row["native"]
    assert set(row["hint_keys"]) == set(RCCLBackend.hint_keys or ())
    table = subprocess.run(
        [sys.executable, "-m", "torchcomms_core.cli", "backends"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    line = next(ln for ln in table.splitlines() if ln.startswith("rccl "))
    assert "torchcomms-rccl" in line and f"no: {NOT_ROCM_REASON}" in line


# -- hints and engine set-up, on a recording stand-in for ProcessGroupNCCL ---------------------


class RecordingEngine:
    """Records how the backend builds and drives the engine (no communication happens)."""

    supports_splitting = True
    created: list[RecordingEngine] = []

    class Options:
        def __init__(self) -> None:
            self._timeout: timedelta | None = None
            self.is_high_priority_stream = False
            self.global_ranks_in_group: list[int] = []
            self.group_name = ""
            self.split_from: Any = None
            self.split_color = -2
            # The NCCLConfig fields torch binds on every NCCL/RCCL version.
            self.config = types.SimpleNamespace(
                blocking=1, cga_cluster_size=0, min_ctas=0, max_ctas=0
            )

    def __init__(self, store: Any, rank: int, size: int, opts: Options) -> None:
        self.rank, self.size, self.opts = rank, size, opts
        self.log: list[tuple[Any, ...]] = []
        RecordingEngine.created.append(self)

    def eager_connect_single_device(self, device: torch.device) -> None:
        self.log.append(("eager", device))

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> Any:
        self.log.append(("allreduce", opts.reduceOp))
        return types.SimpleNamespace(wait=lambda *timeout: True, is_completed=lambda: True)

    def abort(self) -> None:
        self.log.append(("abort",))

    def shutdown(self) -> None:
        self.log.append(("shutdown",))


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Two pretend GPUs and the recording engine; returns the ``set_device`` calls."""
    from torchcomms_core.foundation.env import LOCAL_RANK_VARS

    RecordingEngine.created.clear()
    bound: list[Any] = []
    monkeypatch.setattr(RCCLBackend, "engine_class", classmethod(lambda cls: RecordingEngine))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", bound.append)
    for var in LOCAL_RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    return bound


def _backend(rank: int = 1, size: int = 2, **hints: str) -> RCCLBackend:
    b = RCCLBackend()
    options = CommOptions(
        timeout=TIMEOUT, store=object(), name="c", hints=dict(hints), rank=rank, size=size
    )
    b._bind(torch.device("cuda"), "c", options)
    b.init(torch.device("cuda"), "c", options)
    return b


def test_init_binds_the_ranks_gpu_and_connects_eagerly(two_gpus: list[Any]) -> None:
    b = _backend(rank=1)
    engine = b.engine
    assert isinstance(engine, RecordingEngine) and (engine.rank, engine.size) == (1, 2)
    assert b.device == torch.device("cuda", 1)  # rank 1 of 2 GPUs, no launcher local rank
    assert two_gpus == [torch.device("cuda", 1)]
    assert engine.log[0] == ("eager", torch.device("cuda", 1))
    assert engine.opts._timeout == TIMEOUT
    assert engine.opts.global_ranks_in_group == [0, 1]
    assert engine.opts.is_high_priority_stream is False
    assert b.max_event_pool_size == 1000
    b.finalize()
    assert engine.log[-1] == ("shutdown",)


def test_rccl_hints_reach_the_engine(two_gpus: list[Any]) -> None:
    b = _backend(**{"rccl.high_priority_stream": "yes", "rccl::cgaClusterSize": "4"})
    opts = b.engine.opts
    assert opts.is_high_priority_stream is True
    assert opts.config.cga_cluster_size == 4 and opts.config.blocking == 1
    b = _backend(is_high_priority_stream="true", max_event_pool_size="32")
    assert b.engine.opts.is_high_priority_stream is True and b.max_event_pool_size == 32
    # Another backend's namespace is not this one's to judge, nor to read.
    b = _backend(**{"ncclx.high_priority_stream": "true", "ncclx::cgaClusterSize": "8"})
    assert b.engine.opts.is_high_priority_stream is False
    assert b.engine.opts.config.cga_cluster_size == 0


def test_bad_hints_are_refused_with_what_is_known(two_gpus: list[Any]) -> None:
    with pytest.raises(CommInputError, match="unknown hint 'rccl.high_prio'") as info:
        _backend(**{"rccl.high_prio": "true"})
    assert "rccl.high_priority_stream, rccl.register_memory" in str(info.value)
    with pytest.raises(CommInputError, match="rccl.high_priority_stream='sometimes'") as info:
        _backend(**{"rccl.high_priority_stream": "sometimes"})
    assert "not a boolean; use 'true' or 'false'" in str(info.value)
    with pytest.raises(CommInputError, match="NCCL's config has no field 'noSuchField'") as info:
        _backend(**{"rccl::noSuchField": "1"})
    assert "rccl::cgaClusterSize" in str(info.value)  # the fields are listed
    with pytest.raises(CommInputError, match="is an integer; pass e.g. '4'"):
        _backend(**{"rccl::minCTAs": "many"})
    with pytest.raises(CommInputError, match="max_event_pool_size"):
        _backend(max_event_pool_size="0")
    assert RecordingEngine.created == []  # every refusal came before the engine was made


def test_all_reduce_maps_onto_the_engines_reduce_ops(two_gpus: list[Any]) -> None:
    import torch._C._distributed_c10d as c10d

    b = _backend(rank=0, size=1)
    b.device = torch.device("cpu", 0)  # CPU tensors: the backend only hands them on
    for op, name in ((ReduceOp.SUM, "SUM"), (ReduceOp.MAX, "MAX"), (ReduceOp.AVG, "AVG")):
        b.all_reduce(torch.ones(4), op, False)
        kind, red = b.engine.log[-1]
        assert kind == "allreduce" and red == getattr(c10d.ReduceOp.RedOpType, name)


# -- on a ROCm GPU (world size 1) --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.skipif(
    not HAS_ROCM_GPU,
    reason="needs a ROCm build of torch and an AMD GPU (torch.version.hip is None or "
    "torch.cuda.is_available() is False)",
)
class TestOnRocmGPU:
    """World size 1 on the first AMD GPU: RCCL runs its local path."""

    def test_collectives_and_split(self, world1: None) -> None:
        from torch.distributed import TCPStore

        store = TCPStore("127.0.0.1", 0, 1, True, timeout=TIMEOUT, wait_for_workers=False)
        comm = torchcomms.new_comm(
            "rccl",
            torch.device("cuda"),
            name=f"rccl_{uuid.uuid4().hex[:8]}",
            store=store,
            timeout=TIMEOUT,
        )
        try:
            assert comm.get_backend() == "rccl" and comm.get_size() == 1
            big = torch.arange(4 << 20, dtype=torch.float32, device="cuda")  # 16 MiB
            t = big.clone()
            comm.all_reduce(t, ReduceOp.SUM, async_op=False)
            assert torch.equal(t, big)
            out = torch.empty_like(big)
            comm.all_gather_single(out, big, async_op=True).wait()
            torch.cuda.synchronize()
            assert torch.equal(out, big)
            sub = comm.split([0], name="rccl_sub")
            assert sub is not None and sub.get_size() == 1
            sub.finalize()
        finally:
            comm.finalize()
