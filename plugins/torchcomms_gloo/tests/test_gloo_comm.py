"""Communicator behaviour over real gloo ranks: split, batches, hooks, many communicators."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import CommInputError, OpName, ReduceOp
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("comm"), **kwargs)


def body_split_halves() -> tuple:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    half = n // 2
    mine = list(range(half)) if r < half else list(range(half, n))
    sub = comm.split(mine, "half")
    assert sub is not None and sub.get_name() == "half"
    t = torch.tensor([float(r)])
    sub.all_reduce(t, ReduceOp.SUM)
    # A second-level split and a split with only some members (others pass []).
    solo = sub.split([sub.get_rank()], "solo")
    assert solo.get_size() == 1
    evens = comm.split([k for k in range(n) if k % 2 == 0] if r % 2 == 0 else [], "evens")
    e = None
    if r % 2 == 0:
        x = torch.ones(1)
        evens.all_reduce(x, ReduceOp.SUM)
        e = x.item()
        evens.finalize()
    else:
        assert evens is None
    # The parent keeps working after splitting.
    p = torch.ones(2)
    comm.all_reduce(p, ReduceOp.SUM)
    solo.finalize()
    sub.finalize()
    comm.finalize()
    return sub.get_rank(), sub.get_size(), t.item(), e, p[0].item()


def test_split_creates_working_sub_communicators(pool) -> None:
    n = pool.world_size
    half = n // 2
    res = pool.run(body_split_halves)
    for r, (sub_rank, sub_size, total, evens, parent) in enumerate(res):
        members = range(half) if r < half else range(half, n)
        assert sub_size == half and sub_rank == r % half
        assert total == float(sum(members))
        assert evens == (float((n + 1) // 2) if r % 2 == 0 else None)
        assert parent == float(n)


def body_split_orders_members() -> int:
    comm = _comm()
    n = comm.get_size()
    sub = comm.split(list(reversed(range(n))), "reversed")
    rank = sub.get_rank()
    sub.finalize()
    comm.finalize()
    return rank


def test_split_child_ranks_follow_sorted_parent_ranks(pool2) -> None:
    assert pool2.run(body_split_orders_members) == [0, 1]


def body_split_name_reuse() -> str:
    comm = _comm()
    n = comm.get_size()
    first = comm.split(list(range(n)), "dup")
    try:
        comm.split(list(range(n)), "dup")
    except CommInputError as exc:
        msg = str(exc)
    else:
        msg = "no error"
    first.finalize()
    comm.finalize()
    return msg


def test_reusing_a_split_name_is_an_error(pool2) -> None:
    for msg in pool2.run(body_split_name_reuse):
        assert "named 'dup' already exists" in msg


def body_batch_ring(count: int) -> None:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    right, left = (r + 1) % n, (r - 1) % n
    # Receive first, then send: only correct if the batch issues everything before waiting.
    got_left = torch.empty(count)
    got_right = torch.empty(count)
    batch = comm.batch_op_create()
    batch.recv(got_left, left).recv(got_right, right)
    batch.send(torch.full((count,), float(r)), right).send(torch.full((count,), float(r)), left)
    assert len(batch.ops) == 4
    batch.issue(async_op=False)
    assert bool((got_left == left).all()) and bool((got_right == right).all())
    comm.finalize()


def test_batch_ring_exchange_cannot_deadlock(pool) -> None:
    # 1 Mi floats exceed socket buffers, so a blocking send-before-recv would deadlock.
    pool.run(body_batch_ring, 1 << 20, timeout=60)


def body_hooks() -> list:
    comm = _comm()
    events = []
    pre = comm.register_pre_hook(lambda name, op_id, args: events.append(("pre", str(name), op_id)))
    post = comm.register_post_hook(
        lambda op_id, args: events.append(("post", op_id, args.work.status.name))
    )
    comm.all_reduce(torch.ones(2), ReduceOp.SUM)
    w = comm.broadcast(torch.ones(2), 0, async_op=True)
    w.wait()
    sub = comm.split(list(range(comm.get_size())), "hooked")
    pre.remove()
    post.remove()
    comm.barrier()
    sub.finalize()
    comm.finalize()
    return events


def test_pre_and_post_hooks_see_every_operation_in_order(pool2) -> None:
    for events in pool2.run(body_hooks):
        names = [e[1] for e in events if e[0] == "pre"]
        assert names == [OpName.all_reduce.name, OpName.broadcast.name, OpName.split.name]
        assert [e[0] for e in events] == ["pre", "post"] * 3
        assert events[1][2] == "COMPLETED"
        assert events[0][2] == events[1][1] < events[2][2] == events[3][1]


def body_many_comms() -> list[float]:
    comms = [_comm() for _ in range(4)]
    results = []
    for i, c in enumerate(comms):
        t = torch.full((3,), float(i))
        c.all_reduce(t, ReduceOp.SUM)
        results.append(t[0].item())
    comms[1].finalize()
    # Finalized and live communicators coexist.
    t = torch.ones(1)
    comms[2].all_reduce(t, ReduceOp.SUM)
    results.append(t.item())
    for c in comms:
        c.finalize()
    return results


def test_many_communicators_coexist_in_one_process(pool) -> None:
    n = pool.world_size
    for res in pool.run(body_many_comms):
        assert res == [0.0, n * 1.0, n * 2.0, n * 3.0, float(n)]


def body_identity() -> dict:
    comm = _comm(timeout=timedelta(seconds=7), hints={"k": "v"})
    info = {
        "backend": comm.get_backend(),
        "device": str(comm.get_device()),
        "timeout": comm.get_options().timeout.total_seconds(),
        "hints": comm.get_options().hints,
        "engine": type(comm.get_backend_impl().engine).__name__,
        "impl": type(comm.get_backend_impl()).__name__,
        "abort": comm.is_abort_supported(),
        "native": comm.method_support()["all_reduce"],
    }
    comm.set_timeout(timedelta(seconds=9))
    info["timeout2"] = comm.get_options().timeout.total_seconds()
    # Creation returns on a rank once its own side of gloo's mesh is connected, as in c10d
    # (no barrier after init unless TORCH_DIST_INIT_BARRIER=1): a rank that finalized at
    # once could close a pair its peer is still connecting. Meet before leaving.
    comm.barrier(False)
    comm.finalize()
    return info


def test_communicator_identity_and_options(pool2) -> None:
    info = pool2.run(body_identity)[0]
    assert info == {
        "backend": "gloo",
        "device": "cpu",
        "timeout": 7.0,
        "hints": {"k": "v"},
        "engine": "ProcessGroupGloo",
        "impl": "GlooBackend",
        "abort": True,
        "native": "native",
        "timeout2": 9.0,
    }


def body_duplicate_name() -> str:
    name = unique_name("same")
    comm = torchcomms.new_comm("gloo", "cpu", name=name)
    try:
        torchcomms.new_comm("gloo", "cpu", name=name)
    except CommInputError as exc:
        msg = str(exc)
    else:
        msg = "no error"
    comm.finalize()
    return msg


def test_duplicate_communicator_name_is_an_error(pool2) -> None:
    for msg in pool2.run(body_duplicate_name):
        assert "already exists in this job" in msg and "unique name" in msg


def body_unsupported_dtype() -> str:
    comm = _comm()
    try:
        comm.all_reduce(torch.ones(2, dtype=torch.int16), ReduceOp.SUM)
    except CommInputError as exc:
        msg = str(exc)
    else:
        msg = "no error"
    comm.finalize()
    return msg


def test_dtype_gloo_lacks_is_refused_before_communication(pool2) -> None:
    for msg in pool2.run(body_unsupported_dtype):
        assert "dtype int16, which this backend does not support" in msg


@pytest.mark.parametrize("op", ["finalize", "abort"])
def test_use_after_end_raises(pool2, op) -> None:
    expected = {"finalize": "was finalized", "abort": "was aborted"}[op]
    for msg in pool2.run(body_use_after, op):
        assert expected in msg and "create a new one with torchcomms.new_comm()" in msg


def body_use_after(op: str) -> str:
    comm = _comm()
    # abort() closes this rank's connections at once: let every peer finish creating the
    # communicator first, or its new_comm fails with "connection closed".
    comm.barrier()
    getattr(comm, op)()
    getattr(comm, op)()  # idempotent
    try:
        comm.all_reduce(torch.ones(1), ReduceOp.SUM)
    except torchcomms.CommStateError as exc:
        return str(exc)
    return "no error"


def body_dropped_without_finalize() -> tuple[bool, float]:
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = _comm()
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
        del comm
        gc.collect()
    warned = any(issubclass(w.category, ResourceWarning) for w in caught)
    other = _comm()
    t = torch.ones(1)
    other.all_reduce(t, ReduceOp.SUM)
    other.finalize()
    return warned, t.item()


def test_dropped_communicator_is_released_with_a_warning(pool2) -> None:
    assert pool2.run(body_dropped_without_finalize) == [(True, 2.0), (True, 2.0)]
