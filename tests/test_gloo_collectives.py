"""Every operation over real gloo ranks (2 and 4 processes), checked numerically.

Each body runs on all ranks of a pool; every rank checks its own results against a
reference it computes from all ranks' deterministic inputs.
"""

from __future__ import annotations

import pytest
import torch
from rank_bodies import DTYPES, check, ops_for, product_values, reference, values

import torchcomms
from torchcomms import ReduceOp, WorkStatus
from torchcomms_core.testing import unique_name


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("coll"))


def body_every_op(dtype_name: str, count: int) -> int:
    """Run every operation of the API once at ``count`` elements; return #checks."""
    dtype = DTYPES[dtype_name]
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    checks = 0
    inputs = [values(k, count, dtype) for k in range(n)]

    # all_reduce with every ReduceOp (sync), then async.
    for op in ops_for(dtype):
        src = [product_values(k, count, dtype) for k in range(n)] if op == ReduceOp.PRODUCT \
            else inputs
        t = src[r].clone()
        work = comm.all_reduce(t, op, async_op=False)
        assert work.status is WorkStatus.COMPLETED
        check(f"all_reduce {op}", t, reference(src, op))
        checks += 1
    t = inputs[r].clone()
    work = comm.all_reduce(t, ReduceOp.MAX, async_op=True)
    work.wait()
    assert work.is_completed() and work.status is WorkStatus.COMPLETED
    check("all_reduce async", t, reference(inputs, ReduceOp.MAX))

    # reduce: only the root's result is defined.
    for op in (ReduceOp.SUM, ReduceOp.MIN):
        t = inputs[r].clone()
        comm.reduce(t, n - 1, op, async_op=bool(r % 2)).wait()
        if r == n - 1:
            check(f"reduce {op}", t, reference(inputs, op))
    if dtype.is_floating_point:
        t = inputs[r].clone()
        comm.reduce(t, 0, ReduceOp.AVG)
        if r == 0:
            check("reduce AVG", t, reference(inputs, ReduceOp.AVG))

    t = inputs[r].clone()
    comm.broadcast(t, 1 % n)
    check("broadcast", t, inputs[1 % n])

    outs = [torch.empty(count, dtype=dtype) for _ in range(n)]
    comm.all_gather(outs, inputs[r])
    for k in range(n):
        check(f"all_gather[{k}]", outs[k], inputs[k])
    flat = torch.empty(n * count, dtype=dtype)
    comm.all_gather_single(flat, inputs[r], async_op=True).wait()
    check("all_gather_single", flat, torch.cat(inputs))
    v_inputs = [values(k, count + k, dtype, salt=1) for k in range(n)]
    v_outs = [torch.empty(count + k, dtype=dtype) for k in range(n)]
    comm.all_gather_v(v_outs, v_inputs[r])
    for k in range(n):
        check(f"all_gather_v[{k}]", v_outs[k], v_inputs[k])

    # reduce_scatter: block k of every rank's input is reduced into rank k.
    blocks = {k: [values(k, count, dtype, salt=j) for j in range(n)] for k in range(n)}
    for op in (ReduceOp.SUM, ReduceOp.MAX):
        out = torch.empty(count, dtype=dtype)
        comm.reduce_scatter(out, [b.clone() for b in blocks[r]], op)
        check(f"reduce_scatter {op}", out, reference([blocks[k][r] for k in range(n)], op))
        out = torch.empty(count, dtype=dtype)
        comm.reduce_scatter_single(out, torch.cat(blocks[r]), op)
        check(f"reduce_scatter_single {op}", out,
              reference([blocks[k][r] for k in range(n)], op))
    if dtype.is_floating_point:
        out = torch.empty(count, dtype=dtype)
        comm.reduce_scatter_single(out, torch.cat(blocks[r]), ReduceOp.AVG)
        check("reduce_scatter_single AVG", out,
              reference([blocks[k][r] for k in range(n)], ReduceOp.AVG))
    v_blocks = {k: [values(k, count + j, dtype, salt=j) for j in range(n)] for k in range(n)}
    out = torch.empty(count + r, dtype=dtype)
    comm.reduce_scatter_v(out, v_blocks[r], ReduceOp.SUM)
    check("reduce_scatter_v", out, reference([v_blocks[k][r] for k in range(n)], ReduceOp.SUM))

    # all_to_all: block j of rank k lands in slot k of rank j.
    outs = [torch.empty(count, dtype=dtype) for _ in range(n)]
    comm.all_to_all(outs, [b.clone() for b in blocks[r]])
    for k in range(n):
        check(f"all_to_all[{k}]", outs[k], blocks[k][r])
    a2a_out = torch.empty(n * count, dtype=dtype)
    comm.all_to_all_single(a2a_out, torch.cat(blocks[r]))
    check("all_to_all_single", a2a_out, torch.cat([blocks[k][r] for k in range(n)]))
    in_splits = [count + j for j in range(n)]
    out_splits = [count + r for _ in range(n)]
    a2av_out = torch.empty(sum(out_splits), dtype=dtype)
    comm.all_to_all_v_single(a2av_out, torch.cat(v_blocks[r]), out_splits, in_splits)
    check("all_to_all_v_single", a2av_out, torch.cat([v_blocks[k][r] for k in range(n)]))

    root = n - 1
    out = torch.empty(count, dtype=dtype)
    comm.scatter(out, [b.clone() for b in blocks[root]] if r == root else [], root)
    check("scatter", out, blocks[root][r])
    gathered = [torch.empty(count, dtype=dtype) for _ in range(n)] if r == 0 else []
    comm.gather(gathered, inputs[r], 0)
    if r == 0:
        for k in range(n):
            check(f"gather[{k}]", gathered[k], inputs[k])
    gs = torch.empty(n * count, dtype=dtype) if r == 0 else torch.empty(0, dtype=dtype)
    comm.gather_single(gs, inputs[r], 0)
    if r == 0:
        check("gather_single", gs, torch.cat(inputs))

    # Point to point: a ring, async sends and blocking receives.
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(count, dtype=dtype)
    sw = comm.send(inputs[r], right, async_op=True)
    comm.recv(got, left)
    sw.wait()
    check("send/recv ring", got, inputs[left])
    got = torch.empty(count, dtype=dtype)
    batch = comm.batch_op_create()
    batch.send(inputs[r], right).recv(got, left)
    batch.issue(async_op=True).wait()
    check("batch ring", got, inputs[left])

    comm.barrier()
    comm.barrier(async_op=True).wait()
    comm.finalize()
    return checks


GLOO_DTYPES = [name for name, dt in DTYPES.items()
               if dt in torchcomms.get_backend_class("gloo").supported_dtypes]


@pytest.mark.parametrize("dtype_name", GLOO_DTYPES)
def test_every_op_every_dtype(pool, dtype_name) -> None:
    results = pool.run(body_every_op, dtype_name, 7)
    assert all(c >= 6 for c in results)


@pytest.mark.parametrize("count", [0, 1, 1 << 20], ids=["empty", "one", "1Mi"])
def test_every_op_at_edge_counts(pool, count) -> None:
    pool.run(body_every_op, "float32", count, timeout=120)


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
    check("all_gather_single strided out", out.contiguous().view(-1),
          torch.cat([torch.ones(24) * k for k in range(n)]))
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
    w.wait_blocking()
    comm.finalize()
    return w.status is WorkStatus.COMPLETED and w.error is None


def test_sync_work_can_be_waited_on(pool2) -> None:
    assert pool2.run(body_sync_work_wait_is_harmless) == [True, True]
