"""Core behaviour checked in-process: ReduceOp, TorchWork, registry, hooks, validation.

Ranks are threads over ``memory_backend.MemoryBackend``, which implements only the
spec's required primitives, so every collective here runs on the spec's defaults.
"""

from __future__ import annotations

import copy
import gc
import textwrap
import warnings
from datetime import timedelta
from typing import Any

import pytest
import torch
from memory_backend import MemoryBackend, make_group, run_threads

import torchcomms
from torchcomms import (
    BackendLoadError,
    BackendNotFoundError,
    CommInputError,
    CommStateError,
    CommTimeoutError,
    CommTypeError,
    OpName,
    RedOpType,
    ReduceOp,
    TorchCommBackend,
    WorkStatus,
)
from torchcomms_core.creation.bootstrap import resolve_rank_size
from torchcomms_core.foundation import env as _env
from torchcomms_core.plugin_host import backends as registry

# -- ReduceOp -----------------------------------------------------------------------------


def test_reduce_op_members_have_matching_types() -> None:
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"):
        op = getattr(ReduceOp, name)
        assert op.type is getattr(RedOpType, name)
        assert op == getattr(ReduceOp, name)
    assert ReduceOp.SUM != ReduceOp.MAX


def test_premul_sum_takes_scalar_or_tensor_factor() -> None:
    op = ReduceOp.PREMUL_SUM(0.5)
    assert op.type is RedOpType.PREMUL_SUM and op.factor == 0.5
    factor = torch.tensor([2.0])
    assert ReduceOp.PREMUL_SUM(factor).factor is factor
    assert ReduceOp.PREMUL_SUM(2) == ReduceOp.PREMUL_SUM(2.0)


def test_premul_sum_rejects_bad_factors() -> None:
    with pytest.raises(CommInputError, match="one element"):
        ReduceOp.PREMUL_SUM(torch.ones(3))
    with pytest.raises(CommTypeError, match="float or a one-element tensor"):
        ReduceOp.PREMUL_SUM("x")  # type: ignore[arg-type]


def test_copy_and_deepcopy_keep_the_type() -> None:
    for op in (ReduceOp.AVG, ReduceOp.PREMUL_SUM(3.0), ReduceOp.PREMUL_SUM(torch.tensor(2.0))):
        assert copy.copy(op).type is op.type
        assert copy.deepcopy(op).type is op.type
        assert copy.deepcopy(op) == op


def test_c10d_reduce_ops_are_accepted() -> None:
    import torch.distributed as dist

    from torchcomms_core.operations.reduce_op import coerce_reduce_op

    assert coerce_reduce_op(dist.ReduceOp.MAX) == ReduceOp.MAX
    with pytest.raises(CommTypeError, match="must be a torchcomms.ReduceOp"):
        coerce_reduce_op("sum")


# -- registry -----------------------------------------------------------------------------


def test_gloo_is_discovered_by_entry_point() -> None:
    assert "gloo" in torchcomms.available_backends()
    cls = torchcomms.get_backend_class("gloo")
    assert cls.__module__.startswith("torchcomms_gloo")


def test_unknown_backend_lists_installed_and_names_the_distribution() -> None:
    with pytest.raises(BackendNotFoundError) as info:
        torchcomms.get_backend_class("ncclx-not-here")
    assert "'gloo'" in str(info.value)
    if "ncclx" not in torchcomms.available_backends():
        with pytest.raises(BackendNotFoundError, match="pip install torchcomms-ncclx"):
            torchcomms.get_backend_class("ncclx")


def test_register_backend_in_process() -> None:
    torchcomms.register_backend("memory-test", MemoryBackend)
    try:
        assert torchcomms.get_backend_class("memory-test") is MemoryBackend
        assert "memory-test" in torchcomms.available_backends()
        with pytest.raises(ValueError, match="already registered"):
            torchcomms.register_backend("memory-test", _OtherBackend)
    finally:
        torchcomms.unregister_backend("memory-test")
    assert "memory-test" not in torchcomms.available_backends()


class _OtherBackend(MemoryBackend):
    pass


def test_register_backend_refuses_non_backends() -> None:
    with pytest.raises(BackendLoadError, match="not a subclass"):
        torchcomms.register_backend("bad", object)  # type: ignore[arg-type]


def test_incompatible_spec_version_is_a_clear_error() -> None:
    class Future(MemoryBackend):
        spec_version = "2.0"

    with pytest.raises(BackendLoadError, match="targets backend spec 2.0"):
        torchcomms.register_backend("future", Future)


def test_plugin_that_fails_to_import_names_its_distribution(tmp_path, monkeypatch) -> None:
    dist = tmp_path / "torchcomms_brokenvendor-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: torchcomms-brokenvendor\nVersion: 1.2.3\n"
    )
    (dist / "entry_points.txt").write_text(
        "[torchcomms.backends]\nbrokenvendor = torchcomms_brokenvendor:Backend\n"
    )
    (tmp_path / "torchcomms_brokenvendor.py").write_text(
        textwrap.dedent("""
        raise ImportError("libvendor.so: cannot open shared object file")
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "brokenvendor" in torchcomms.available_backends()
    with pytest.raises(BackendLoadError) as info:
        torchcomms.get_backend_class("brokenvendor")
    msg = str(info.value)
    assert "torchcomms-brokenvendor 1.2.3" in msg and "libvendor.so" in msg
    assert isinstance(info.value.__cause__, ImportError)
    # Other backends keep working.
    assert torchcomms.get_backend_class("gloo") is not None


def test_resolving_a_backend_imports_only_that_plugin(tmp_path) -> None:
    import subprocess
    import sys

    code = (
        "import sys, torchcomms; assert 'torchcomms_gloo' not in sys.modules; "
        "torchcomms.get_backend_class('gloo'); "
        "print(sorted(m for m in sys.modules if m.startswith('torchcomms_')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "torchcomms_gloo" in out and "torchcomms_ncclx" not in out


# -- backend introspection ----------------------------------------------------------------


def test_required_only_backend_reports_everything_else_derived() -> None:
    support = torchcomms.method_support(MemoryBackend)
    assert support["send"] == "native" and support["recv"] == "native"
    for op in ("all_reduce", "all_gather_v", "reduce_scatter_v", "all_to_all", "gather_single"):
        assert support[op] == "derived"
    assert support["split"] == "native"  # MemoryBackend splits its fabric itself
    assert support["abort"] == "unsupported"


def test_gloo_reports_native_and_derived_methods() -> None:
    support = torchcomms.method_support(torchcomms.get_backend_class("gloo"))
    assert support["all_reduce"] == "native"
    assert support["all_gather_v"] == "derived"
    assert support["reduce_scatter_v"] == "derived"


def test_a_default_that_only_forwards_is_native_where_its_target_is() -> None:
    class NativeVariableSizes(MemoryBackend):
        def reduce_scatter_v(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("never called: only introspected")

    support = torchcomms.method_support(NativeVariableSizes)
    assert support["reduce_scatter_v"] == "native"
    assert support["reduce_scatter"] == "native"  # its default forwards to the native one
    assert support["reduce_scatter_single"] == "derived"  # its default re-slices first
    assert support["all_gather"] == "derived"  # all_gather_v is still derived
    assert torchcomms.method_support(MemoryBackend)["reduce_scatter"] == "derived"


def test_backend_missing_required_methods_cannot_be_instantiated() -> None:
    class Incomplete(TorchCommBackend):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


# -- derived collectives over send/recv ---------------------------------------------------


@pytest.mark.parametrize("size", [2, 3])
def test_derived_collectives_compute_exact_results(size: int) -> None:
    comms = make_group(size, name=f"derived{size}")

    def body(comm):
        r, n = comm.get_rank(), comm.get_size()
        out = {}
        t = torch.arange(5, dtype=torch.float32) + r
        comm.all_reduce(t, ReduceOp.SUM)
        out["all_reduce"] = t
        t = torch.full((3,), float(r + 2))
        comm.all_reduce(t, ReduceOp.PRODUCT)
        out["product"] = t
        t = torch.full((4,), float(r))
        comm.broadcast(t, root=n - 1)
        out["broadcast"] = t
        g = torch.empty(n * 2)
        comm.all_gather_single(g, torch.full((2,), float(r)))
        out["all_gather_single"] = g
        lst = [torch.empty(i + 1) for i in range(n)]
        comm.all_gather_v(lst, torch.full((r + 1,), float(r)))
        out["all_gather_v"] = torch.cat(lst)
        o = torch.empty(2)
        comm.reduce_scatter_single(
            o, torch.arange(2 * n, dtype=torch.float32) * (r + 1), ReduceOp.SUM
        )
        out["reduce_scatter_single"] = o
        o = torch.empty(r + 1)
        comm.reduce_scatter_v(o, [torch.ones(i + 1) * (r + 1) for i in range(n)], ReduceOp.MAX)
        out["reduce_scatter_v"] = o
        a = torch.empty(n)
        comm.all_to_all_single(a, torch.arange(n, dtype=torch.float32) + 10 * r)
        out["all_to_all_single"] = a
        s = torch.empty(2)
        comm.scatter(s, [torch.full((2,), float(i)) for i in range(n)] if r == 0 else [], 0)
        out["scatter"] = s
        gs = torch.empty(n)
        comm.gather_single(gs, torch.tensor([float(r)]), root=0)
        out["gather_single"] = gs if r == 0 else None
        comm.barrier()
        return out

    res = run_threads(comms, body)
    n = size
    for r, out in enumerate(res):
        assert torch.equal(out["all_reduce"], torch.arange(5.0) * n + sum(range(n)))
        assert torch.equal(out["product"], torch.full((3,), float(torch.arange(2, n + 2).prod())))
        assert torch.equal(out["broadcast"], torch.full((4,), float(n - 1)))
        assert torch.equal(out["all_gather_single"], torch.arange(n).repeat_interleave(2).float())
        assert torch.equal(
            out["all_gather_v"], torch.cat([torch.full((i + 1,), float(i)) for i in range(n)])
        )
        total = sum(range(1, n + 1))
        assert torch.equal(
            out["reduce_scatter_single"], torch.tensor([2.0 * r, 2.0 * r + 1]) * total
        )
        assert torch.equal(out["reduce_scatter_v"], torch.full((r + 1,), float(n)))
        assert torch.equal(out["all_to_all_single"], torch.tensor([r + 10.0 * i for i in range(n)]))
        assert torch.equal(out["scatter"], torch.full((2,), float(r)))
    assert torch.equal(res[0]["gather_single"], torch.arange(n).float())


def test_derived_avg_and_premul_sum() -> None:
    comms = make_group(2, name="avg")

    def body(comm):
        r = comm.get_rank()
        a = torch.tensor([1.0, 3.0]) * (r + 1)
        comm.all_reduce(a, ReduceOp.AVG)
        p = torch.tensor([1.0, 3.0]) * (r + 1)
        comm.all_reduce(p, ReduceOp.PREMUL_SUM(0.5))
        return a, p

    for a, p in run_threads(comms, body):
        assert torch.equal(a, torch.tensor([1.5, 4.5]))
        assert torch.equal(p, torch.tensor([1.5, 4.5]))


def test_noncontiguous_tensors_are_handled_by_the_core() -> None:
    comms = make_group(2, name="strided")

    def body(comm):
        t = torch.arange(12, dtype=torch.float32).view(3, 4).t()  # non-contiguous
        comm.all_reduce(t, ReduceOp.SUM)
        return t

    for t in run_threads(comms, body):
        assert not t.is_contiguous()
        assert torch.equal(t, (torch.arange(12.0).view(3, 4).t()) * 2)


# -- hooks, lifecycle, failures -----------------------------------------------------------


def test_hooks_run_in_order_and_can_be_removed() -> None:
    comms = make_group(2, name="hooks")
    events: list[list[tuple]] = [[], []]
    handles = []
    for i, comm in enumerate(comms):
        handles.append(
            comm.register_pre_hook(
                lambda name, op_id, args, i=i: events[i].append(("pre", name, op_id))
            )
        )
        handles.append(
            comm.register_post_hook(
                lambda op_id, args, i=i: events[i].append(("post", op_id, args.work.status))
            )
        )

    def body(comm):
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
        comm.barrier()

    run_threads(comms, body)
    for ev in events:
        assert [e[0] for e in ev] == ["pre", "post", "pre", "post"]
        assert ev[0][1] is OpName.all_reduce and ev[2][1] is OpName.barrier
        assert ev[0][2] == ev[1][1] and ev[2][2] == ev[3][1] and ev[0][2] < ev[2][2]
        assert ev[1][2] is WorkStatus.COMPLETED
    for h in handles:
        h.remove()
    run_threads(comms, body)
    assert all(len(ev) == 4 for ev in events)


def test_hook_args_expose_the_operation_arguments() -> None:
    comms = make_group(2, name="hookargs")
    seen = []
    comms[0].register_pre_hook(lambda name, op_id, args: seen.append(args))

    def body(comm):
        comm.reduce(torch.ones(3), 1, ReduceOp.MAX, async_op=False)

    run_threads(comms, body)
    (args,) = seen
    assert args.root == 1 and args.op == ReduceOp.MAX and args.tensor.shape == (3,)
    assert args.async_op is False


def test_finalize_is_idempotent_and_later_calls_fail_clearly() -> None:
    (comm,) = make_group(1, name="fin")
    comm.finalize()
    comm.finalize()
    with pytest.raises(CommStateError, match="was finalized; create a new one"):
        comm.all_reduce(torch.ones(1), ReduceOp.SUM)
    with pytest.raises(CommStateError, match="finalized"):
        comm.split([0], "child")


def test_timeout_marks_work_and_communicator_and_runs_abort_hooks() -> None:
    comms = make_group(2, name="to", timeout_s=0.3)
    aborted = []
    comms[0].register_abort_hook(lambda: aborted.append(True))
    work = comms[0].recv(torch.empty(1), 1, async_op=True)
    with pytest.raises(CommTimeoutError, match="recv on communicator 'to' timed out"):
        work.wait()
    assert work.status is WorkStatus.TIMEDOUT and isinstance(work.error, CommTimeoutError)
    assert aborted == [True]
    with pytest.raises(CommStateError, match="failed earlier"):
        comms[0].all_reduce(torch.ones(1), ReduceOp.SUM)


def test_a_failed_work_tells_its_own_communicator_and_no_other() -> None:
    import torchcomms_core.foundation.work as work_module

    # No process-wide listener: each work reaches the communicator it holds.
    assert not hasattr(work_module, "set_failure_listener")
    comms = make_group(2, name="own-a", timeout_s=0.3)
    others = make_group(2, name="own-b")
    work = comms[0].recv(torch.empty(1), 1, async_op=True)
    with pytest.raises(CommTimeoutError):
        work.wait()
    with pytest.raises(CommStateError, match="failed earlier"):
        comms[0].all_reduce(torch.ones(1), ReduceOp.SUM)
    run_threads(others, lambda c: c.all_reduce(torch.ones(1), ReduceOp.SUM))  # still fine

    class Holder:  # a work built by hand for something that is not a communicator
        def get_name(self) -> str:
            return "holder"

        def is_aborted(self) -> bool:
            return False

    class Broken:
        def wait(self) -> None:
            raise RuntimeError("connection reset by peer")

    manual = torchcomms.TorchWork(Broken(), None, Holder(), "all_reduce")  # type: ignore[arg-type]
    with pytest.raises(torchcomms.CommOperationError, match="on communicator 'holder' failed"):
        manual.wait()
    assert manual.status is WorkStatus.ERROR


def test_an_engine_that_cannot_start_names_the_timeout_or_the_failure() -> None:
    from torchcomms_core.foundation.work import engine_start_error

    cause = RuntimeError("Socket Timeout")
    err = engine_start_error("new_comm: x", timedelta(seconds=5), cause, "; retry")
    assert isinstance(err, CommTimeoutError) and err.__cause__ is cause
    assert str(err) == "new_comm: x within 0:00:05: Socket Timeout; retry"
    err = engine_start_error("new_comm: x", timedelta(seconds=5), ValueError("bad"), "; retry")
    assert isinstance(err, torchcomms.CommOperationError) and str(err) == "new_comm: x: bad"


def test_async_work_reports_status() -> None:
    comms = make_group(2, name="status")

    def body(comm):
        if comm.get_rank() == 0:
            w = comm.send(torch.ones(2), 1, async_op=True)
        else:
            w = comm.recv(torch.empty(2), 0, async_op=True)
        w.wait()
        w.wait()  # harmless twice
        return w.status, w.is_completed()

    for status, done in run_threads(comms, body):
        assert status is WorkStatus.COMPLETED and done


def test_dropped_communicator_warns_and_releases() -> None:
    (comm,) = make_group(1, name="dropped")
    backend = comm.get_backend_impl()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del comm
        gc.collect()
    assert any(
        issubclass(w.category, ResourceWarning) and "without finalize()" in str(w.message)
        for w in caught
    )
    assert backend._fabric is None  # released


def test_split_in_process_groups() -> None:
    comms = make_group(4, name="parent")

    def body(comm):
        r = comm.get_rank()
        group = [0, 1] if r < 2 else [2, 3]
        sub = comm.split(group, "pairs")
        t = torch.tensor([float(r)])
        sub.all_reduce(t, ReduceOp.SUM)
        return sub.get_rank(), sub.get_size(), t.item()

    res = run_threads(comms, body)
    assert res == [(0, 2, 1.0), (1, 2, 1.0), (0, 2, 5.0), (1, 2, 5.0)]


# -- validation (before any communication) ------------------------------------------------


@pytest.fixture
def comm2():
    comms = make_group(2, name="valid")
    yield comms[0]
    for c in comms:
        c.finalize()


BAD_INPUTS = [
    (lambda c: c.all_reduce([1.0], ReduceOp.SUM), CommTypeError, "tensor must be a torch.Tensor"),
    (lambda c: c.all_reduce(torch.ones(2), "sum"), CommTypeError, "must be a torchcomms.ReduceOp"),
    (
        lambda c: c.all_reduce(torch.ones(2), ReduceOp.BAND),
        CommInputError,
        "BAND is bitwise and needs an integer",
    ),
    (
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.int32), ReduceOp.AVG),
        CommInputError,
        "AVG needs a floating-point tensor",
    ),
    (
        lambda c: c.all_reduce(torch.ones(2, dtype=torch.complex64), ReduceOp.SUM),
        CommInputError,
        "dtype complex64, which this backend does not support",
    ),
    (
        lambda c: c.broadcast(torch.ones(2), 2),
        CommInputError,
        "root=2 is out of range for communicator 'valid' of size 2; valid ranks are 0..1",
    ),
    (lambda c: c.send(torch.ones(2), -1), CommInputError, "dst=-1 is out of range"),
    (lambda c: c.send(torch.ones(2), 0), CommInputError, "dst=0 is this rank itself"),
    (
        lambda c: c.all_gather([torch.empty(2)], torch.ones(2)),
        CommInputError,
        "tensor_list has 1 tensors but must have one per rank (communicator size 2)",
    ),
    (
        lambda c: c.all_gather([torch.empty(2), torch.empty(3)], torch.ones(2)),
        CommInputError,
        "tensor_list[1] has 3 elements",
    ),
    (
        lambda c: c.all_gather_single(torch.empty(3), torch.ones(2)),
        CommInputError,
        "output has 3 elements (shape (3,)) but must have 4",
    ),
    (
        lambda c: c.all_gather_single(torch.empty(4, dtype=torch.int64), torch.ones(2)),
        CommInputError,
        "output has dtype int64 but input has dtype float32",
    ),
    (
        lambda c: c.reduce_scatter_single(torch.empty(2), torch.ones(5), ReduceOp.SUM),
        CommInputError,
        "input has 5 elements",
    ),
    (
        lambda c: c.all_to_all_single(torch.empty(3), torch.ones(3)),
        CommInputError,
        "must be divisible by the communicator size 2",
    ),
    (
        lambda c: c.all_to_all_v_single(torch.empty(3), torch.ones(3), [1, 2], [2, 2]),
        CommInputError,
        "input_split_sizes sums to 4 but the tensor has 3 rows",
    ),
    (
        lambda c: c.all_to_all_v_single(torch.empty(3), torch.ones(3), [2, 1], [1, 2]),
        CommInputError,
        "output_split_sizes[0]=2 must equal input_split_sizes[0]=1",
    ),
    (
        lambda c: c.scatter(torch.empty(2), [torch.ones(2)], 0),
        CommInputError,
        "input_tensor_list has 1 tensors",
    ),
    (
        lambda c: c.gather([torch.empty(2), torch.empty(2)], torch.ones(3), 0),
        CommInputError,
        "output_tensor_list[0] has 2 elements",
    ),
    (lambda c: c.split([0, 0, 1], "x"), CommInputError, "contain duplicates [0]"),
    (lambda c: c.split([1], "x"), CommInputError, "do not include this rank (0)"),
    (lambda c: c.split([0, 5], "x"), CommInputError, "ranks[1]=5 is out of range"),
    (lambda c: c.split([0], ""), CommInputError, "name must be a non-empty string"),
    (lambda c: c.set_timeout(timedelta(seconds=-1)), CommInputError, "timeout must be positive"),
    (lambda c: c.batch_op_create().send(torch.ones(1), 7), CommInputError, "dst=7 is out of range"),
]


@pytest.mark.parametrize(
    "call,exc,message",
    BAD_INPUTS,
    ids=[m.split(" ")[0] + str(i) for i, (_, _, m) in enumerate(BAD_INPUTS)],
)
def test_bad_input_is_refused_with_a_clear_message(comm2, call, exc, message) -> None:
    with pytest.raises(exc) as info:
        call(comm2)
    assert message in str(info.value)


def test_tensor_on_a_foreign_device_is_refused(comm2) -> None:
    t = torch.ones(2, device="meta")
    with pytest.raises(
        CommInputError,
        match="is on device meta, but communicator 'valid' owns device cpu; move it with .to",
    ):
        comm2.all_reduce(t, ReduceOp.SUM)


# -- bootstrap ----------------------------------------------------------------------------


def test_rank_and_size_precedence(monkeypatch) -> None:
    # The reference's "auto" order: explicit, then mpi (OpenMPI, PMI), pals, torchrun; then
    # SLURM, which only we read.
    for rank_var, size_var, _ in _env.LAUNCHER_RANK_SIZE:
        monkeypatch.delenv(rank_var, raising=False)
        monkeypatch.delenv(size_var, raising=False)
    monkeypatch.delenv("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", raising=False)
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "8")
    assert resolve_rank_size() == (2, 8, "SLURM")
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert resolve_rank_size() == (4, 8, "torchrun (RANK/WORLD_SIZE)")
    monkeypatch.setenv("PALS_RANKID", "6")
    monkeypatch.setenv("PMI_SIZE", "8")
    assert resolve_rank_size()[:2] == (6, 8)
    monkeypatch.setenv("PMI_RANK", "3")
    assert resolve_rank_size()[:2] == (3, 8)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "8")
    assert resolve_rank_size()[:2] == (1, 8)
    monkeypatch.setenv("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", "torchrun")
    assert resolve_rank_size()[:2] == (4, 8)
    monkeypatch.setenv("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", "pals")
    assert resolve_rank_size()[:2] == (6, 8)
    monkeypatch.setenv("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", "mpi")
    assert resolve_rank_size()[:2] == (1, 8)
    monkeypatch.setenv("TORCHCOMM_RANK", "5")
    monkeypatch.setenv("TORCHCOMM_SIZE", "8")
    assert resolve_rank_size()[:2] == (5, 8)
    monkeypatch.setenv("TORCHCOMM_BOOTSTRAP_RANKSIZE_QUERY_METHOD", "slurm")
    with pytest.raises(torchcomms.BootstrapError, match="use auto, mpi, pals or torchrun"):
        resolve_rank_size()


def test_missing_launcher_environment_says_what_to_set(monkeypatch) -> None:
    for rank_var, size_var, _ in _env.LAUNCHER_RANK_SIZE:
        monkeypatch.delenv(rank_var, raising=False)
        monkeypatch.delenv(size_var, raising=False)
    with pytest.raises(torchcomms.BootstrapError, match="Launch with torchrun"):
        torchcomms.new_comm("gloo", "cpu")


def test_inconsistent_rank_environment(monkeypatch) -> None:
    monkeypatch.setenv("TORCHCOMM_RANK", "4")
    monkeypatch.setenv("TORCHCOMM_SIZE", "2")
    with pytest.raises(torchcomms.BootstrapError, match="need 0 <= rank < size"):
        resolve_rank_size()


def test_timeout_environment_variable(monkeypatch) -> None:
    monkeypatch.setenv("TORCHCOMM_TIMEOUT_SECONDS", "12.5")
    assert _env.default_timeout() == timedelta(seconds=12.5)
    monkeypatch.setenv("TORCHCOMM_TIMEOUT_SECONDS", "soon")
    with pytest.raises(ValueError, match="is not a number"):
        _env.default_timeout()
    monkeypatch.delenv("TORCHCOMM_TIMEOUT_SECONDS")
    assert _env.default_timeout() == timedelta(seconds=600)


def test_backend_on_wrong_device_type_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    with pytest.raises(CommInputError, match="runs on cpu devices, not 'cuda'"):
        torchcomms.new_comm("gloo", torch.device("cuda"))


def test_single_rank_gloo_comm_with_explicit_store(monkeypatch) -> None:
    from torch.distributed import HashStore

    monkeypatch.setenv("TORCHCOMM_RANK", "0")
    monkeypatch.setenv("TORCHCOMM_SIZE", "1")
    store = HashStore()
    comm = torchcomms.new_comm("gloo", "cpu", name="solo", store=store)
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    assert torch.equal(t, torch.ones(3)) and comm.get_size() == 1
    with pytest.raises(CommInputError, match="named 'solo' already exists"):
        torchcomms.new_comm("gloo", "cpu", name="solo", store=store)
    comm.finalize()
    assert registry.KNOWN_DISTRIBUTIONS["ncclx"] == "torchcomms-ncclx"


def test_wait_blocking_forwards_only_where_the_backend_has_a_host_blocking_wait() -> None:
    class Engine:  # what a GPU engine's work offers: wait() orders, wait_blocking() blocks
        def __init__(self) -> None:
            self.calls: list[str] = []

        def wait(self) -> bool:
            self.calls.append("wait")
            return True

        def wait_blocking(self) -> bool:
            self.calls.append("wait_blocking")
            return True

    class Backend:
        def __init__(self, supports: bool) -> None:
            self.supports_wait_blocking = supports

    class Owner:
        def __init__(self, supports: bool) -> None:
            self.backend = Backend(supports)

        def get_backend_impl(self) -> Backend:
            return self.backend

        def get_backend(self) -> str:
            return "gpu" if self.backend.supports_wait_blocking else "cpu"

        def get_name(self) -> str:
            return "owner"

        def is_aborted(self) -> bool:
            return False

    gpu_engine = Engine()
    gpu = torchcomms.TorchWork(gpu_engine, None, Owner(True), "all_reduce")  # type: ignore[arg-type]
    assert gpu.wait_blocking() and gpu_engine.calls == ["wait_blocking", "wait"]
    assert gpu.status is WorkStatus.COMPLETED
    cpu_engine = Engine()
    cpu = torchcomms.TorchWork(cpu_engine, None, Owner(False), "all_reduce")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="waitBlocking not implemented for backend 'cpu'"):
        cpu.wait_blocking()
    assert cpu_engine.calls == [] and cpu.status is WorkStatus.INPROGRESS
    assert cpu.wait() and cpu_engine.calls == ["wait"]
