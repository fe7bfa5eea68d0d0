"""Every operation over real gloo ranks (2 and 4 processes), checked numerically.

Each body runs on all ranks of a pool; every rank checks its own results against a
reference it computes from all ranks' deterministic inputs.
"""

from __future__ import annotations

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp, WorkStatus
from torchcomms_core.testing import unique_name
from torchcomms_core.testing.contracts import body_every_op
from torchcomms_core.testing.reference import DTYPES, check


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("coll"))


GLOO_DTYPES = [
    name
    for name, dt in DTYPES.items()
    if dt in torchcomms.get_backend_class("gloo").supported_dtypes
]


@pytest.mark.parametrize("dtype_name", GLOO_DTYPES)
def test_every_op_every_dtype(pool, dtype_name) -> None:
    results = pool.run(body_every_op, "gloo", "cpu", dtype_name, 7)
    assert all(c >= 6 for c in results)


@pytest.mark.parametrize("count", [0, 1, 1 << 20], ids=["empty", "one", "1Mi"])
def test_every_op_at_edge_counts(pool, count) -> None:
    pool.run(body_every_op, "gloo", "cpu", "float32", count, timeout=120)


def body_large(count: int) -> float:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    t = torch.full((count,), float(r + 1))
    comm.all_reduce(t, ReduceOp.SUM)
    assert bool((t == n * (n + 1) / 2).all()), "large all_reduce mismatch"
    out = torch.empty(count * n, dtype=torch.float32)
    comm.all_gather_single(out, t)
    assert bool((out == n * (n + 1) / 2).all()), "large all_gather_single mismatch"
    b = torch.full((count,), float(r))
    comm.broadcast(b, 0)
    assert bool((b == 0).all()), "large broadcast mismatch"
    comm.finalize()
    return float(t[-1])


def test_large_tensors_16Mi_elements(pool2) -> None:
    assert pool2.run(body_large, 16 << 20, timeout=180) == [3.0, 3.0]


def body_noncontiguous() -> None:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    base = torch.arange(24, dtype=torch.float32).view(4, 6) + r
    t = base.t()  # non-contiguous in-place tensor
    comm.all_reduce(t, ReduceOp.SUM, async_op=True).wait()
    want = (torch.arange(24, dtype=torch.float32).view(4, 6) * n + sum(range(n))).t()
    check("all_reduce strided", t, want)
    assert not t.is_contiguous()
    out = torch.empty(6, 4 * n).t()  # strided output
    comm.all_gather_single(out, (torch.ones(4, 6) * r)[:, :].contiguous().t().contiguous().t())
    check(
        "all_gather_single strided out",
        out.contiguous().view(-1),
        torch.cat([torch.ones(24) * k for k in range(n)]),
    )
    src = torch.arange(2 * n * 3, dtype=torch.float32).view(3, 2 * n).t()  # strided input
    dst = torch.empty(2 * n, 3)
    comm.all_to_all_single(dst, src)
    got = dst.view(n, 2, 3)
    for k in range(n):
        check(f"all_to_all_single strided[{k}]", got[k], src.contiguous().view(n, 2, 3)[r])
    b = torch.zeros(5, 2).t()
    if r == 0:
        b.copy_(torch.arange(10.0).view(2, 5))
    comm.broadcast(b, 0)
    check("broadcast strided", b, torch.arange(10.0).view(2, 5))
    comm.finalize()


def test_noncontiguous_inputs_and_outputs(pool) -> None:
    pool.run(body_noncontiguous)


def body_async_many_in_flight() -> list[float]:
    comm = _comm()
    r = comm.get_rank()
    tensors = [torch.full((1000,), float(r + i)) for i in range(8)]
    works = [comm.all_reduce(t, ReduceOp.SUM, async_op=True) for t in tensors]
    for w in works:
        w.wait()
    comm.finalize()
    return [float(t[0]) for t in tensors]


def test_many_async_ops_complete_in_issue_order(pool) -> None:
    results = pool.run(body_async_many_in_flight)
    n = pool.world_size
    for res in results:
        assert res == [float(sum(range(n)) + n * i) for i in range(8)]


def body_sync_work_wait_is_harmless() -> bool:
    comm = _comm()
    t = torch.ones(3)
    w = comm.all_reduce(t, ReduceOp.SUM, async_op=False)
    w.wait()
    # As in the reference: a CPU backend's wait() already blocks the host.
    try:
        w.wait_blocking()
        refused = False
    except RuntimeError as exc:
        refused = "waitBlocking not implemented" in str(exc) and "wait()" in str(exc)
    w.wait()  # still fine after the refusal
    # An asynchronous work refuses too, and its wait() then completes the operation.
    a = torch.ones(3)
    pending = comm.all_reduce(a, ReduceOp.SUM, async_op=True)
    try:
        pending.wait_blocking()
        refused_async = False
    except RuntimeError as exc:
        refused_async = "waitBlocking not implemented for backend 'gloo'" in str(exc)
    pending.wait()
    summed = a.tolist() == [float(comm.get_size())] * 3
    comm.finalize()
    return (
        refused
        and refused_async
        and summed
        and w.status is WorkStatus.COMPLETED
        and w.error is None
        and pending.status is WorkStatus.COMPLETED
    )


def test_sync_work_can_be_waited_on(pool2) -> None:
    assert pool2.run(body_sync_work_wait_is_harmless) == [True, True]


def body_single_forms_with_shaped_buffers() -> None:
    comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("shaped"))
    r, n = comm.get_rank(), comm.get_size()
    out = torch.empty(n, 2, 3)
    comm.all_gather_single(out, torch.full((2, 3), float(r)))
    want = torch.arange(n).float().view(n, 1, 1).expand(n, 2, 3)
    check("all_gather_single [n, *shape]", out, want)
    red = torch.empty(2, 3)
    comm.reduce_scatter_single(red, torch.ones(n, 2, 3), ReduceOp.SUM)
    check("reduce_scatter_single [n, *shape]", red, torch.full((2, 3), float(n)))
    comm.finalize()


def test_single_forms_accept_stacked_shapes(pool2) -> None:
    pool2.run(body_single_forms_with_shaped_buffers)
