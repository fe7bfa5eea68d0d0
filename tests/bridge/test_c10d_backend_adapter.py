"""A ``_BackendWrapper`` registered as a backend of a plain c10d ``ProcessGroup``.

``pg._register_backend(device, type, _BackendWrapper(comm))`` (what torch's own
``setup_torchcomms_pg`` test helper and the reference's ``test_backend_wrapper`` do) needs
c10d to take a Python ``Backend``. torch 2.14 does: the bridge registers a
``BackendAdapter`` around the wrapper, and the plain group's calls run on the
communicator, its hooks included. torch 2.13 does not: the call is refused, saying what
works instead. Every body runs on 2 real ranks over gloo.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms_core.c10d.backend_wrapper import _BackendWrapper
from torchcomms_core.c10d.ops import OPS
from torchcomms_core.foundation import torch_compat
from torchcomms_core.testing import unique_name

RELEASE = ".".join(str(n) for n in torch_compat.RELEASE)
needs_python_backend = pytest.mark.skipif(
    not torch_compat.PYTHON_C10D_BACKEND,
    reason=f"torch {RELEASE}: c10d.Backend has no Python constructor, so a wrapper cannot "
    "be registered inside another ProcessGroup (the bridge refuses it; see "
    "test_the_refusal_names_the_release_and_the_routes_that_work)",
)

#: What c10d's trampoline for a Python backend (torch 2.14's ``PyBackend``) calls by name
#: for a group's operations.
C10D_CALLS = (
    "broadcast",
    "allreduce",
    "allreduce_sparse",
    "allreduce_coalesced",
    "reduce",
    "allgather",
    "all_gather_single",
    "allgather_coalesced",
    "all_gather_single_coalesced",
    "gather",
    "scatter",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_single_coalesced",
    "all_to_all_single",
    "alltoall",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
    "monitored_barrier",
    "start_coalescing",
    "end_coalescing",
    "getBackendName",
    "eager_connect_single_device",
    "set_timeout",
    "abort",
    "shutdown",
    "split",
)

#: What c10d reads as properties of a Python backend.
C10D_PROPERTIES = (
    "supports_window",
    "supports_reconfigure",
    "supports_splitting",
    "supports_coalescing",
    "supports_time_estimate",
    "supports_shrinking",
)


def _plain_group(comm: Any) -> Any:
    """A plain c10d group with the communicator's wrapper registered as its CPU backend."""
    pg = dist.ProcessGroup(dist.HashStore(), comm.get_rank(), comm.get_size())
    pg._register_backend(
        torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, _BackendWrapper(comm)
    )
    pg._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
    pg._set_group_name(comm.get_name())
    return pg


def _collectives(pg: Any) -> dict[str, list[float]]:
    """all_reduce, all_gather, broadcast, barrier and a send/recv ring on ``pg``'s methods."""
    r, n = pg.rank(), pg.size()
    out: dict[str, list[float]] = {}
    t = torch.arange(4, dtype=torch.float32) + r
    pg.allreduce([t]).wait()
    out["all_reduce"] = t.tolist()
    gathered = [torch.empty(2) for _ in range(n)]
    pg.allgather([gathered], [torch.full((2,), float(r + 1))]).wait()
    out["all_gather"] = torch.cat(gathered).tolist()
    b = torch.full((3,), float(r))
    pg.broadcast(b, root=n - 1).wait()
    out["broadcast"] = b.tolist()
    pg.barrier().wait()
    got = torch.empty(2)
    if r % 2 == 0:
        pg.send([torch.full((2,), float(10 + r))], (r + 1) % n, 0).wait()
        pg.recv([got], (r - 1) % n, 0).wait()
    else:
        pg.recv([got], (r - 1) % n, 0).wait()
        pg.send([torch.full((2,), float(10 + r))], (r + 1) % n, 0).wait()
    out["send_recv"] = got.tolist()
    return out


def _expected(r: int, n: int) -> dict[str, list[float]]:
    return {
        "all_reduce": [float(n * i + sum(range(n))) for i in range(4)],
        "all_gather": [float(k + 1) for k in range(n) for _ in range(2)],
        "broadcast": [float(n - 1)] * 3,
        "send_recv": [float(10 + (r - 1) % n)] * 2,
    }


def body_hooks_see_the_plain_groups_calls() -> dict[str, Any]:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("adapter"))
    try:
        pg = _plain_group(comm)
        pre: list[tuple[str, int]] = []
        post: list[int] = []
        handles = [
            comm.register_pre_hook(lambda name, op_id, args: pre.append((str(name), op_id))),
            comm.register_post_hook(lambda op_id, args: post.append(op_id)),
        ]
        hooked = _collectives(pg)
        for h in handles:
            h.remove()
        seen = list(pre)
        # Without hooks the calls take the engine's lane: same results, nothing recorded.
        bare = _collectives(pg)
        backend = pg._get_backend(torch.device("cpu"))
        return {
            "rank": comm.get_rank(),
            "size": comm.get_size(),
            "hooked": hooked,
            "bare": bare,
            "pre": seen,
            "post": post,
            "after_removal": len(pre) - len(seen),
            "backend_type": type(backend).__name__,
            "same_comm": backend.get_comm() is comm,
            "backend_name": pg._get_backend_name(),
            "group_name": backend.group_name == comm.get_name(),
        }
    finally:
        comm.finalize()


@needs_python_backend
def test_a_plain_group_runs_on_the_communicator_and_its_hooks_see_every_call(pool2) -> None:
    for res in pool2.run(body_hooks_see_the_plain_groups_calls, timeout=90):
        r, n = res["rank"], res["size"]
        assert res["hooked"] == _expected(r, n), res
        assert res["bare"] == _expected(r, n), res
        names = [name for name, _ in res["pre"]]
        p2p = ["send", "recv"] if r % 2 == 0 else ["recv", "send"]
        assert names == ["all_reduce", "all_gather", "broadcast", "barrier", *p2p], names
        # Each post hook answers its pre hook, in order, with increasing ids.
        ids = [op_id for _, op_id in res["pre"]]
        assert res["post"] == ids and ids == sorted(set(ids)), res
        assert res["after_removal"] == 0
        assert res["backend_type"] == "BackendAdapter"
        assert res["same_comm"] and res["group_name"]
        assert res["backend_name"] == "custom"


def body_coalesce_barrier_split() -> dict[str, Any]:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("adapter"))
    try:
        pg = _plain_group(comm)
        r = pg.rank()
        names: list[str] = []
        comm.register_pre_hook(lambda name, op_id, args: names.append(str(name)))
        # A coalescing block: c10d starts and ends it on the backend.
        dev = torch.device("cpu")
        a, b = torch.full((2,), float(r + 1)), torch.full((3,), float(2 * r))
        pg._start_coalescing(dev)
        pg.allreduce([a])
        pg.allreduce([b])
        pg._end_coalescing(dev).wait()
        # c10d passes barrier options; the wrapper takes their timeout.
        pg.monitored_barrier(timedelta(seconds=30), True)
        # A split of the plain group asks the backend to split.
        child = pg.split_group([0, 1], group_name=unique_name("adapter-split"))
        t = torch.full((2,), float(r + 5))
        child.allreduce([t]).wait()
        child_backend = child._get_backend(dev)
        child_comm = child_backend.get_comm()
        out = {
            "coalesced": [a.tolist(), b.tolist()],
            "split": t.tolist(),
            "split_backend": type(child_backend).__name__,
            "split_comm_is_new": child_comm is not comm,
            "names": names,
        }
        child_comm.finalize()
        # A rank outside a split takes its part in it, then is told it has no group
        # (c10d cannot take None from a Python backend).
        try:
            only = pg.split_group([0], group_name=unique_name("adapter-one"))
        except torchcomms.TorchCommError as exc:
            out["outside"] = str(exc)
        else:
            t = torch.full((2,), 4.0)
            only.allreduce([t]).wait()
            out["alone"] = t.tolist()
            only._get_backend(dev).get_comm().finalize()
        return out
    finally:
        comm.finalize()


@needs_python_backend
def test_coalescing_monitored_barrier_and_split_group_reach_the_wrapper(pool2) -> None:
    results = pool2.run(body_coalesce_barrier_split, timeout=90)
    for res in results:
        assert res["coalesced"] == [[3.0, 3.0], [2.0, 2.0, 2.0]], res
        assert res["split"] == [11.0, 11.0], res
        assert res["split_backend"] == "BackendAdapter"
        assert res["split_comm_is_new"]
        assert res["names"][:2] == ["all_reduce", "all_reduce"], res
    first, second = results
    assert first["alone"] == [4.0, 4.0] and "outside" not in first, first
    assert "alone" not in second, second
    assert "rank 1 is not in [0]" in second["outside"], second
    assert "pg._get_backend(device).split_group(ranks)" in second["outside"], second


@needs_python_backend
def test_the_adapter_answers_every_call_c10d_makes_of_a_python_backend() -> None:
    from torchcomms_core.c10d.backend_adapter import ADAPTER

    assert ADAPTER is not None
    defined = set(vars(ADAPTER))
    assert {n for op in OPS for n in op.names} <= defined
    assert set(C10D_CALLS) <= defined
    # Read as properties by c10d; one the adapter leaves to c10d's Backend recurses.
    for capability in C10D_PROPERTIES:
        assert capability in defined, capability
    assert ADAPTER.supports_window is False and ADAPTER.supports_reconfigure is False


def body_capabilities() -> list[Any]:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("adapter"))
    try:
        pg = _plain_group(comm)
        backend = pg._get_backend(torch.device("cpu"))
        # The group's own answers come from C++, which asks the adapter.
        return [
            pg.supports_window,
            pg.supports_reconfigure,
            *(getattr(backend, c) for c in C10D_PROPERTIES),
        ]
    finally:
        comm.finalize()


@needs_python_backend
def test_capabilities_are_the_wrappers_and_never_recurse(pool2) -> None:
    for res in pool2.run(body_capabilities):
        # window, reconfigure (group and backend), splitting, coalescing, time estimate,
        # shrinking.
        assert res == [False, False, False, False, True, True, False, False], res


def body_refusal() -> str:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("adapter"))
    try:
        with pytest.raises(TypeError) as info:
            _plain_group(comm)
        return str(info.value)
    finally:
        comm.finalize()


@pytest.mark.skipif(
    torch_compat.PYTHON_C10D_BACKEND,
    reason=f"torch {RELEASE} takes a Python c10d.Backend: the wrapper is registered",
)
def test_the_refusal_names_the_release_and_the_routes_that_work(pool2) -> None:
    from torchcomms_core.foundation.errors import CommTypeError

    assert issubclass(CommTypeError, TypeError)
    for message in pool2.run(body_refusal):
        assert f"torch {RELEASE} offers no way to build a Backend from Python" in message
        assert "_create_torchcomm_process_group" in message
        assert "TORCH_DISTRIBUTED_USE_TORCHCOMMS=1" in message
