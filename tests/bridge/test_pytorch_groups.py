"""torch.distributed over torchcomms: ``dist.*(group=pg)`` matches a plain gloo group.

Each body wraps a fresh communicator as a process group, builds a plain gloo group with
``dist.new_group`` in the same ranks, runs the same calls on both and compares.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

import torchcomms
import torchcomms._backend_wrapper
from torchcomms.device_mesh import as_process_group
from torchcomms_core.testing import unique_name


def _groups():
    """Our group (the default one, as nothing else is initialised) and a plain gloo group."""
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("pt"))
    ours = as_process_group(comm)
    plain = dist.new_group(backend="gloo")
    return comm, ours, plain


def _cleanup() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _collectives(pg) -> dict:
    r, n = dist.get_rank(pg), dist.get_world_size(pg)
    out = {}
    t = torch.arange(6, dtype=torch.float32) + r
    dist.all_reduce(t, group=pg)
    out["all_reduce"] = t
    t = torch.full((3,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=pg)
    out["all_reduce_max"] = t
    g = torch.empty(n * 4)
    dist.all_gather_into_tensor(g, torch.arange(4, dtype=torch.float32) * (r + 1), group=pg)
    out["all_gather_into_tensor"] = g
    lst = [torch.empty(2) for _ in range(n)]
    dist.all_gather(lst, torch.full((2,), float(r)), group=pg)
    out["all_gather"] = torch.cat(lst)
    rs = torch.empty(3)
    dist.reduce_scatter_tensor(rs, torch.arange(3 * n, dtype=torch.float32) * (r + 1), group=pg)
    out["reduce_scatter_tensor"] = rs
    a2a = torch.empty(2 * n)
    dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float32) + 10 * r, group=pg)
    out["all_to_all_single"] = a2a
    b = torch.full((5,), float(r))
    dist.broadcast(b, src=n - 1, group=pg)
    out["broadcast"] = b
    red = torch.full((2,), float(r + 1))
    dist.reduce(red, dst=0, group=pg)
    out["reduce"] = red if r == 0 else None
    gathered = [torch.empty(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), gathered, dst=0, group=pg)
    out["gather"] = torch.cat(gathered) if r == 0 else None
    sc = torch.empty(2)
    dist.scatter(
        sc, [torch.full((2,), float(i * 7)) for i in range(n)] if r == 0 else None, src=0, group=pg
    )
    out["scatter"] = sc
    got = torch.empty(4)
    right, left = (r + 1) % n, (r - 1) % n
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, got, left, group=pg),
            dist.P2POp(dist.isend, torch.full((4,), float(r)), right, group=pg),
        ]
    )
    for req in reqs:
        req.wait()
    out["batch_isend_irecv"] = got
    dist.barrier(group=pg)
    return out


def body_collectives_match_plain_gloo() -> dict:
    try:
        comm, ours, plain = _groups()
        names: list = []
        comm.register_pre_hook(lambda name, op_id, args: names.append(str(name)))
        a, b = _collectives(ours), _collectives(plain)
        # The batch went through the batch API as one issue, not op by op.
        assert names.count("batch_op_issue") == 1 and "send" not in names, names
        for key in a:
            if a[key] is None:
                assert b[key] is None, key
            else:
                assert torch.equal(a[key], b[key]), (key, a[key], b[key])
        return {k: (v.tolist() if v is not None else None) for k, v in a.items()}
    finally:
        _cleanup()


def test_torch_distributed_calls_match_a_plain_gloo_group(pool) -> None:
    res = pool.run(body_collectives_match_plain_gloo, timeout=90)
    n = pool.world_size
    assert res[0]["all_reduce"][0] == sum(range(n))
    assert res[1]["broadcast"] == [float(n - 1)] * 5


def body_group_is_registered() -> tuple:
    try:
        comm, ours, _ = _groups()
        from torch.distributed import distributed_c10d as c10d

        assert type(dist.group.WORLD).__name__ == "_BackendWrapper"
        assert ours.get_comm() is comm
        assert c10d._resolve_process_group(ours.group_name) is ours
        assert as_process_group(comm) is ours
        assert dist.get_backend(ours) == "gloo"
        return (
            ours.group_name,
            dist.get_process_group_ranks(ours),
            dist.get_rank(ours),
            ours.size(),
        )
    finally:
        _cleanup()


def test_wrapped_comm_is_registered_and_resolvable_by_name(pool2) -> None:
    res = pool2.run(body_group_is_registered)
    assert res[0][0] == res[1][0]
    assert [r[1] for r in res] == [[0, 1], [0, 1]]
    assert [r[2] for r in res] == [0, 1]


def body_functional_collectives() -> list:
    import torch.distributed._functional_collectives as funcol

    try:
        _, ours, _ = _groups()
        r, n = dist.get_rank(), dist.get_world_size()
        x = funcol.all_reduce(torch.full((3,), float(r)), "sum", ours).wait()
        y = funcol.all_gather_single(torch.full((2,), float(r)), 0, ours).wait()
        z = funcol.reduce_scatter_single(torch.ones(2 * n), "sum", 0, ours).wait()
        # Two tensors at once go through the flattened (coalesced) paths.
        ag = funcol.all_gather_single_coalesced(
            [torch.full((2,), float(r)), torch.full((1, 3), float(r + 5))], ours
        )
        rs = funcol.reduce_scatter_single_coalesced(
            [torch.arange(2.0 * n), torch.ones(n, 2) * (r + 1)], "sum", [0, 0], ours
        )
        return [
            x.tolist(),
            y.tolist(),
            z.tolist(),
            [t.wait().tolist() for t in ag],
            [t.wait().tolist() for t in rs],
        ]
    finally:
        _cleanup()


def test_functional_collectives_resolve_the_group_by_name(pool2) -> None:
    x, y, z, ag, rs = pool2.run(body_functional_collectives)[1]
    assert x == [1.0, 1.0, 1.0]
    assert y == [0.0, 0.0, 1.0, 1.0]
    assert z == [2.0, 2.0]
    assert ag == [[0.0, 0.0, 1.0, 1.0], [[5.0, 5.0, 5.0], [6.0, 6.0, 6.0]]]
    assert rs == [[4.0, 6.0], [[3.0, 3.0]]]


def body_work_future_and_errors() -> list:
    try:
        _, ours, _ = _groups()
        r = dist.get_rank()
        t = torch.full((4,), float(r + 1))
        work = dist.all_reduce(t, group=ours, async_op=True)
        fut = work.get_future()
        value = fut.then(lambda f: f.value()[0] * 2).wait()
        # gloo completes the future just before it marks the work done: wait() first.
        work.wait()
        assert work.is_completed() and work.is_success() and work.exception() is None
        avg = torch.full((2,), float(r))
        dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=ours)
        pre = torch.ones(2)
        dist.all_reduce(pre, op=torch.distributed._make_nccl_premul_sum(0.5), group=ours)
        try:
            dist.all_gather_into_tensor(torch.empty(3), torch.ones(2), group=ours)
        except RuntimeError as exc:  # the engine lane: gloo's own refusal, as on plain gloo
            msg = str(exc)
        else:
            msg = "no error"
        return [value.tolist(), avg.tolist(), pre.tolist(), msg]
    finally:
        _cleanup()


def test_work_has_a_future_and_reduce_ops_map(pool2) -> None:
    value, avg, pre, msg = pool2.run(body_work_future_and_errors)[0]
    assert value == [6.0] * 4
    assert avg == [0.5, 0.5]
    assert pre == [1.0, 1.0]
    assert "ProcessGroupGloo::allgather: invalid tensor size" in msg, msg


def body_split_and_new_group() -> list:
    try:
        _, ours, _ = _groups()
        r, n = dist.get_rank(), dist.get_world_size()
        mine = [k for k in range(n) if k % 2 == r % 2]
        sub = ours.split_group(mine)
        t = torch.ones(1)
        dist.all_reduce(t, group=sub)
        return [type(sub).__name__, t.item(), sub.get_comm().get_size()]
    finally:
        _cleanup()


def test_split_group_gives_a_wrapped_sub_communicator(pool) -> None:
    res = pool.run(body_split_and_new_group)
    n = pool.world_size
    for r, (kind, total, size) in enumerate(res):
        assert kind == "_BackendWrapper"
        expected = len([k for k in range(n) if k % 2 == r % 2])
        assert total == expected and size == expected


def body_coalescing_manager() -> list:
    from torch.distributed.distributed_c10d import _coalescing_manager

    try:
        _, ours, _ = _groups()
        r = dist.get_rank()
        ts = [torch.full((k + 1,), float(r + k)) for k in range(3)]
        with _coalescing_manager(group=ours, async_ops=True) as cm:
            for t in ts:
                dist.all_reduce(t, group=ours)
        cm.wait()
        got = torch.empty(2)
        n = dist.get_world_size()
        with _coalescing_manager(group=ours, device=torch.device("cpu"), async_ops=True) as cm:
            dist.irecv(got, (r - 1) % n, group=ours)
            dist.isend(torch.full((2,), float(r)), (r + 1) % n, group=ours)
        cm.wait()
        return [t.tolist() for t in ts] + [got.tolist()]
    finally:
        _cleanup()


def test_coalescing_manager_runs_on_the_wrapper(pool2) -> None:
    res = pool2.run(body_coalescing_manager)
    assert res[0][:3] == [[1.0], [3.0, 3.0], [5.0, 5.0, 5.0]]
    assert res[0][3] == [1.0, 1.0] and res[1][3] == [0.0, 0.0]


def body_monitored_barrier(skip: int) -> str:
    from datetime import timedelta

    try:
        _groups()
        if dist.get_rank() == skip:
            return "skipped"
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=1 if skip >= 0 else 10))
        except RuntimeError as exc:
            return str(exc)
        return "ok"
    finally:
        _cleanup()


def test_monitored_barrier_passes_when_every_rank_arrives(pool) -> None:
    assert pool.run(body_monitored_barrier, -1) == ["ok"] * pool.world_size


def test_monitored_barrier_names_the_rank_that_did_not_arrive(pool2) -> None:
    msg, skipped = pool2.run(body_monitored_barrier, 1)
    assert skipped == "skipped"
    assert "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms" in msg


def body_lifecycle_reaches_the_comm() -> list:
    from datetime import timedelta

    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("pt"))
    pg = torchcomms._backend_wrapper._BackendWrapper(comm)
    pg._set_default_timeout(timedelta(seconds=123))
    timeout = comm.get_timeout().total_seconds()
    work = pg.allreduce([torch.ones(2)])
    waited = work.wait(timedelta(seconds=5))
    pg.shutdown()
    other = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("pt"))
    # Abort does not wait for peers: let every rank finish connecting before one aborts.
    other.barrier()
    torchcomms._backend_wrapper._BackendWrapper(other).abort()
    return [timeout, waited, comm.is_finalized(), other.is_aborted(), pg.name()]


def test_timeout_shutdown_and_abort_reach_the_communicator(pool2) -> None:
    assert pool2.run(body_lifecycle_reaches_the_comm)[0] == [123.0, True, True, True, "gloo"]


def body_method_overloads() -> list:
    from datetime import timedelta

    try:
        _, ours, _ = _groups()
        r, n = ours.rank(), ours.size()
        a = torch.full((2,), float(r))
        ours.allreduce(a, dist.ReduceOp.MAX).wait()
        b = torch.full((2,), float(r))
        ours.broadcast(b, n - 1).wait()
        c = torch.ones(1)
        ours.reduce(c, 0, dist.ReduceOp.SUM).wait()
        d = [torch.empty(1) for _ in range(n)]
        ours.allgather(d, torch.full((1,), float(r))).wait()
        ours.barrier(timeout=timedelta(seconds=30)).wait()
        return [a.tolist(), b.tolist(), c.item() if r == 0 else None, [t.item() for t in d]]
    finally:
        _cleanup()


def test_process_group_method_overloads_work_directly(pool2) -> None:
    a, b, c, d = pool2.run(body_method_overloads)[0]
    assert a == [1.0, 1.0] and b == [1.0, 1.0] and c == 2.0 and d == [0.0, 1.0]
