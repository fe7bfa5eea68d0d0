"""``torchcomms.distwrap``: one training script through ``torch.distributed`` and through
distwrap in both modes gives the same results; every collective once on real ranks.

Each body initialises the default group on a fresh prefix of the pool's store and
destroys it before returning.
"""

from __future__ import annotations

import inspect
import os
import warnings
from typing import Any

import pytest
import torch
import torch.distributed as c10d
from torch import nn

import torchcomms.distwrap as distwrap
from torchcomms_core.testing import unique_name

MODES = ("c10d", "distwrap", "distwrap-torchcomms")
STEPS = 3


def _store() -> Any:
    tcp = c10d.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    return c10d.PrefixStore(unique_name("distwrap-store"), tcp)


def _init(mode: str) -> Any:
    """The module the script uses, initialised on this rank."""
    rank, size = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    store = _store()
    if mode == "c10d":
        c10d.init_process_group("gloo", store=store, rank=rank, world_size=size)
        return c10d
    distwrap.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=size,
        use_torchcomms=mode == "distwrap-torchcomms",
    )
    return distwrap


# -- the training script: written once, against whichever module it is given -------------


def _train(dist: Any) -> dict[str, Any]:
    """Data-parallel SGD: rank 0's weights broadcast, gradients averaged by hand."""
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(100 + rank)  # different on every rank until the broadcast
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))
    for p in model.parameters():
        dist.broadcast(p.data, src=0)
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randn(4 * size, 6, generator=gen), torch.randn(4 * size, 2, generator=gen))]
    data *= STEPS
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for x, y in data:
        xs, ys = x[4 * rank : 4 * (rank + 1)], y[4 * rank : 4 * (rank + 1)]
        loss = nn.functional.mse_loss(model(xs), ys)
        loss.backward()
        works = [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]
        for work in works:
            work.wait()
        for p in model.parameters():
            p.grad /= size
        opt.step()
        opt.zero_grad()
        every = [torch.empty(1) for _ in range(size)]
        dist.all_gather(every, loss.detach().reshape(1))
        losses.append([float(t) for t in every])
    dist.barrier()
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    return {"losses": losses, "params": flat}


def body_train(mode: str) -> dict[str, Any]:
    dist = _init(mode)
    try:
        return _train(dist)
    finally:
        dist.destroy_process_group()


def test_one_training_script_three_ways_gives_the_same_results(pool) -> None:
    ranks = pool.world_size
    results = {mode: pool.run(body_train, mode, timeout=120) for mode in MODES}
    reference = results["c10d"]
    for mode in MODES[1:]:
        for rank in range(ranks):
            ours, ref = results[mode][rank], reference[rank]
            torch.testing.assert_close(
                torch.tensor(ours["losses"]), torch.tensor(ref["losses"]), rtol=1e-6, atol=1e-7
            )
            torch.testing.assert_close(ours["params"], ref["params"], rtol=1e-6, atol=1e-7)
    # Data parallel: every rank ends with the same weights, and they moved.
    for rank in range(1, ranks):
        torch.testing.assert_close(reference[rank]["params"], reference[0]["params"])
    assert reference[0]["losses"][0] != reference[0]["losses"][-1]


# -- every collective once -----------------------------------------------------------------


def _every_call(dist: Any, torchcomms_mode: bool) -> dict[str, Any]:
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    t = torch.arange(4, dtype=torch.float32) + r
    assert dist.all_reduce(t) is None
    out["all_reduce"] = t
    t = torch.full((2,), float(r + 1))
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["all_reduce_max"] = t
    b = torch.full((3,), float(r))
    dist.broadcast(b, src=n - 1)
    out["broadcast"] = b
    b = torch.full((3,), float(r))
    dist.broadcast(b, group_src=1)
    out["broadcast_group_src"] = b
    red = torch.full((2,), float(r + 1))
    dist.reduce(red, dst=0)
    out["reduce"] = red if r == 0 else None
    red = torch.full((2,), float(r + 1))
    dist.reduce(red, group_dst=n - 1, op=dist.ReduceOp.PRODUCT)
    out["reduce_product"] = red if r == n - 1 else None
    lst = [torch.empty(2) for _ in range(n)]
    dist.all_gather(lst, torch.full((2,), float(r)))
    out["all_gather"] = torch.cat(lst)
    g = torch.empty(n * 3)
    dist.all_gather_into_tensor(g, torch.arange(3, dtype=torch.float32) * (r + 1))
    out["all_gather_into_tensor"] = g
    rs = torch.empty(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(r * 10 + k)) for k in range(n)])
    out["reduce_scatter"] = rs
    rs = torch.empty(3)
    dist.reduce_scatter_tensor(rs, torch.arange(3 * n, dtype=torch.float32) * (r + 1))
    out["reduce_scatter_tensor"] = rs
    a2a = torch.empty(2 * n)
    dist.all_to_all_single(a2a, torch.arange(2 * n, dtype=torch.float32) + 10 * r)
    out["all_to_all_single"] = a2a
    in_splits = [k + 1 for k in range(n)]  # rank r sends k+1 rows to rank k
    out_splits = [r + 1] * n
    a2av = torch.empty(sum(out_splits))
    src = torch.cat([torch.full((k + 1,), float(100 * r + k)) for k in range(n)])
    dist.all_to_all_single(a2av, src, out_splits, in_splits)
    out["all_to_all_single_v"] = a2av
    if torchcomms_mode:  # gloo's own engine has no list all_to_all
        outs = [torch.empty(2) for _ in range(n)]
        dist.all_to_all(outs, [torch.full((2,), float(10 * r + k)) for k in range(n)])
        out["all_to_all"] = torch.cat(outs)
    sc = torch.empty(2)
    dist.scatter(sc, [torch.full((2,), float(k * 7)) for k in range(n)] if r == 0 else None, src=0)
    out["scatter"] = sc
    gathered = [torch.empty(2) for _ in range(n)] if r == 0 else None
    dist.gather(torch.full((2,), float(r)), gathered, dst=0)
    out["gather"] = torch.cat(gathered) if gathered else None
    work = dist.barrier(async_op=True)
    work.wait()
    # Point to point: a ring of isend/irecv, then send/recv with the source returned.
    right, left = (r + 1) % n, (r - 1) % n
    got = torch.empty(3)
    sw = dist.isend(torch.full((3,), float(r)), dst=right)
    rw = dist.irecv(got, src=left)
    sw.wait()
    rw.wait()
    out["isend_irecv"] = got
    if r == 0:
        got = torch.empty(2)
        out["recv_source"] = dist.recv(got, src=n - 1)
        out["recv"] = got
        got = torch.empty(2)
        out["recv_any_source"] = dist.recv(got)
        out["recv_any"] = got
    elif r == n - 1:
        dist.send(torch.full((2,), 5.0), dst=0)
        dist.send(torch.full((2,), 6.0), group_dst=0)
    got = torch.empty(4)
    reqs = dist.batch_isend_irecv(
        [
            dist.P2POp(dist.irecv, got, left),
            dist.P2POp(dist.isend, torch.full((4,), float(r)), right),
        ]
    )
    for req in reqs:
        req.wait()
    out["batch_isend_irecv"] = got
    # Object collectives.
    objs: list[Any] = [None] * n
    dist.all_gather_object(objs, {"rank": r, "name": f"r{r}"})
    out["all_gather_object"] = objs
    gathered_objs: list[Any] | None = [None] * n if r == 0 else None
    dist.gather_object([r, r * r], gathered_objs, dst=0)
    out["gather_object"] = gathered_objs
    one: list[Any] = [None]
    dist.scatter_object_list(one, [f"to {k}" for k in range(n)] if r == 1 else None, src=1)
    out["scatter_object_list"] = one[0]
    items: list[Any] = [r, "x"] if r == n - 1 else [None, None]
    dist.broadcast_object_list(items, src=n - 1)
    out["broadcast_object_list"] = items
    out["ranks"] = dist.get_process_group_ranks(dist.group.WORLD)
    return out


def _expected(r: int, n: int) -> dict[str, Any]:
    f = torch.tensor
    exp: dict[str, Any] = {
        "all_reduce": torch.arange(4, dtype=torch.float32) * n + sum(range(n)),
        "all_reduce_max": torch.full((2,), float(n)),
        "broadcast": torch.full((3,), float(n - 1)),
        "broadcast_group_src": torch.full((3,), 1.0),
        "reduce": torch.full((2,), float(n * (n + 1) // 2)) if r == 0 else None,
        "reduce_product": (
            torch.full((2,), float(torch.arange(1, n + 1).prod())) if r == n - 1 else None
        ),
        "all_gather": torch.cat([torch.full((2,), float(k)) for k in range(n)]),
        "all_gather_into_tensor": torch.cat(
            [torch.arange(3, dtype=torch.float32) * (k + 1) for k in range(n)]
        ),
        "reduce_scatter": torch.full((2,), float(sum(k * 10 + r for k in range(n)))),
        "reduce_scatter_tensor": torch.arange(3 * r, 3 * r + 3, dtype=torch.float32)
        * sum(k + 1 for k in range(n)),
        "all_to_all_single": torch.cat(
            [torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 10 * k for k in range(n)]
        ),
        "all_to_all_single_v": torch.cat(
            [torch.full((r + 1,), float(100 * k + r)) for k in range(n)]
        ),
        "all_to_all": torch.cat([torch.full((2,), float(10 * k + r)) for k in range(n)]),
        "scatter": torch.full((2,), float(r * 7)),
        "gather": torch.cat([torch.full((2,), float(k)) for k in range(n)]) if r == 0 else None,
        "isend_irecv": torch.full((3,), float((r - 1) % n)),
        "batch_isend_irecv": torch.full((4,), float((r - 1) % n)),
        "all_gather_object": [{"rank": k, "name": f"r{k}"} for k in range(n)],
        "gather_object": [[k, k * k] for k in range(n)] if r == 0 else None,
        "scatter_object_list": f"to {r}",
        "broadcast_object_list": [n - 1, "x"],
        "ranks": list(range(n)),
    }
    if r == 0:
        exp.update(
            recv_source=n - 1, recv=f([5.0, 5.0]), recv_any_source=n - 1, recv_any=f([6.0, 6.0])
        )
    return exp


def body_every_call(mode: str) -> dict[str, Any]:
    dist = _init(mode)
    try:
        return _every_call(dist, mode == "distwrap-torchcomms")
    finally:
        dist.destroy_process_group()


def _check(results: list[dict[str, Any]], mode: str) -> None:
    n = len(results)
    for r, got in enumerate(results):
        exp = _expected(r, n)
        for key, value in got.items():
            want = exp[key]
            if isinstance(want, torch.Tensor):
                torch.testing.assert_close(value, want, msg=f"{mode} rank {r} {key}")
            else:
                assert value == want, (mode, r, key, value, want)
        missing = set(exp) - set(got) - ({"all_to_all"} if mode != "distwrap-torchcomms" else set())
        assert not missing, (mode, r, missing)


def test_every_call_matches_torch_distributed(pool) -> None:
    for mode in MODES:
        _check(pool.run(body_every_call, mode, timeout=120), mode)


def body_torchcomms_only() -> dict[str, Any]:
    """What only the torchcomms mode has, and what it refuses."""
    dist = _init("distwrap-torchcomms")
    r, n = dist.get_rank(), dist.get_world_size()
    out: dict[str, Any] = {}
    try:
        t = torch.ones(2)
        try:
            c10d.all_reduce(t)
        except RuntimeError as exc:
            out["direct"] = str(exc)
        try:
            dist.new_group([0])
        except RuntimeError as exc:
            out["new_group"] = str(exc)
        halves = [list(range(n // 2)), list(range(n // 2, n))]
        sub = dist.split_group(split_ranks=halves)
        mine = halves[0] if r < n // 2 else halves[1]
        out["sub_ranks"] = dist.get_process_group_ranks(sub)
        out["sub_rank"] = dist.get_rank(sub)
        s = torch.full((1,), float(r))
        dist.all_reduce(s, group=sub)
        out["sub_sum"] = float(s)
        b = torch.full((1,), float(r))
        dist.broadcast(b, src=mine[-1], group=sub)  # a global rank of the subgroup
        out["sub_broadcast"] = float(b)
        firsts = dist.split_group(split_ranks=[[0]])
        out["non_member"] = firsts is None if r != 0 else firsts is not None
        p = torch.full((2,), 3.0)
        dist.all_reduce(p, op=dist._make_nccl_premul_sum(0.5))
        out["premul"] = p.tolist()
        win = dist.new_window()
        out["window"] = type(win).__name__
        try:
            dist.register_mem_pool(None, "cpu", object())
            out["register_mem_pool"] = "no-op"
        except Exception as exc:  # pragma: no cover - reported below
            out["register_mem_pool"] = repr(exc)
        try:
            dist.get_mem_allocator(None, "cpu")
        except Exception as exc:
            out["allocator"] = type(exc).__name__
        win.tensor_deregister() if win.get_tensor() is not None else None
        dist.destroy_process_group(sub)
    finally:
        dist.destroy_process_group()
    out["after_destroy"] = c10d.is_initialized() or dist.uses_torchcomms()
    return out


def test_torchcomms_mode_refuses_direct_calls_and_splits(pool) -> None:
    results = pool.run(body_torchcomms_only, timeout=120)
    n = len(results)
    for r, got in enumerate(results):
        assert "allreduce()" in got["direct"] and "torchcomms.distwrap.all_reduce" in got["direct"]
        assert "split_group" in got["new_group"]
        mine = list(range(n // 2)) if r < n // 2 else list(range(n // 2, n))
        assert got["sub_ranks"] == mine and got["sub_rank"] == mine.index(r)
        assert got["sub_sum"] == float(sum(mine))
        assert got["sub_broadcast"] == float(mine[-1])
        assert got["non_member"] is True
        assert got["premul"] == [1.5 * n] * 2
        assert got["window"] == "TorchCommWindow"
        assert got["register_mem_pool"] == "no-op"
        assert got["allocator"] == "BackendLoadError"
        assert got["after_destroy"] is False


# -- in one process, on the fake backend ---------------------------------------------------


def test_backend_strings() -> None:
    from torchcomms_core.pytorch.distwrap.world import c10d_backend, parse_backend

    assert parse_backend("gloo") == {"cpu": "gloo"}
    assert parse_backend("ncclx") == {"cuda": "ncclx"}
    assert parse_backend("hccl") == {"mtia": "hccl"}
    assert parse_backend("cpu:gloo,cuda:nccl") == {"cpu": "gloo", "cuda": "nccl"}
    assert c10d_backend("ncclx") == "nccl"
    assert c10d_backend("cpu:gloo,cuda:ncclx") == "cpu:gloo,cuda:nccl"
    assert c10d_backend("rcclx") == "rccl"
    for bad in ("cpu:gloo,cpu:gloo", "", "cpu:"):
        with pytest.raises(RuntimeError):
            parse_backend(bad)


def test_signatures_follow_torch_distributed() -> None:
    """Every call takes c10d's parameters in c10d's order (distwrap's extras after them)."""
    names = (
        "all_reduce broadcast reduce all_gather all_gather_into_tensor reduce_scatter "
        "reduce_scatter_tensor all_to_all all_to_all_single scatter gather barrier send recv "
        "isend irecv batch_isend_irecv all_gather_object gather_object scatter_object_list "
        "broadcast_object_list destroy_process_group split_group"
    ).split()
    for name in names:
        ours = list(inspect.signature(getattr(distwrap, name)).parameters)
        theirs = list(inspect.signature(getattr(c10d, name)).parameters)
        assert ours == theirs[: len(ours)], (name, ours, theirs)
    init = list(inspect.signature(distwrap.init_process_group).parameters)
    assert (
        init[-1] == "use_torchcomms"
        and init[:-1] == list(inspect.signature(c10d.init_process_group).parameters)[:9]
    )


def test_fake_world_in_one_process() -> None:
    """Any world size on the fake backend: calls complete, direct c10d calls are refused."""
    distwrap.init_process_group(
        "fake", store=c10d.HashStore(), rank=2, world_size=8, use_torchcomms=True
    )
    try:
        assert (distwrap.get_rank(), distwrap.get_world_size()) == (2, 8)
        t = torch.full((3,), 4.0)
        assert distwrap.all_reduce(t) is None
        assert t.tolist() == [4.0] * 3  # left as it was: nothing was communicated
        work = distwrap.all_gather([torch.empty(3) for _ in range(8)], t, async_op=True)
        assert work.wait() and work.is_completed()
        with pytest.raises(RuntimeError, match="torchcomms.distwrap.barrier"):
            c10d.barrier()
        with pytest.raises(RuntimeError, match="split_group"):
            distwrap.new_group([0, 1])
        with pytest.raises(RuntimeError, match="no communicator for meta tensors"):
            distwrap.all_reduce(torch.ones(1, device="meta"))
        with pytest.raises(RuntimeError, match="tag=3"):
            distwrap.send(t, dst=0, tag=3)
        with pytest.raises(RuntimeError, match="already initialised"):
            distwrap.init_process_group("fake", store=c10d.HashStore(), rank=0, world_size=1)
    finally:
        distwrap.destroy_process_group()
    assert not c10d.is_initialized() and not distwrap.uses_torchcomms()


def test_process_group_nccl_is_explained_on_a_cpu_build() -> None:
    if hasattr(c10d, "ProcessGroupNCCL"):
        assert distwrap.ProcessGroupNCCL is c10d.ProcessGroupNCCL
    else:
        with pytest.raises(AttributeError, match="no NCCL"):
            distwrap.ProcessGroupNCCL  # noqa: B018


def test_pg_options_without_priority_warn() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        distwrap.init_process_group(
            "fake",
            store=c10d.HashStore(),
            rank=0,
            world_size=1,
            pg_options=object(),
            use_torchcomms=True,
        )
    distwrap.destroy_process_group()
    assert any("pg_options" in str(w.message) for w in caught)
