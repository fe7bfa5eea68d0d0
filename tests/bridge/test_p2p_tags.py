"""c10d ``send``/``recv`` tags through the bridge: matched by tag, as on plain gloo.

Two messages between the same ranks, sent under different tags, are received by receives
posted in the opposite order. Matched by tag each lands in the receive of its tag; with
the tag dropped they would match by order and swap. Each body runs the same calls on a
plain gloo group, under PyTorch's switch (the engine lane, and the general path that
hooks force) and on a group of ``_create_torchcomm_process_group``, and returns what each
saw. A backend that cannot match by tag refuses a nonzero tag instead of dropping it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch
import torch.distributed as dist

import torchcomms
from torchcomms_core.testing import unique_name

# 16 MiB of float32 per message (4 Mi elements): large enough that gloo cannot have
# finished a send before its receive is posted.
BIG = 4 * 1024 * 1024

_client_store: Any = None


def _store() -> Any:
    global _client_store
    if _client_store is None:
        _client_store = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
    return dist.PrefixStore(unique_name("tags"), _client_store)


@contextlib.contextmanager
def _world(how: str) -> Iterator[Any]:
    """The group the calls run on: ``plain`` gloo, ``switched``, ``hooked`` (switched,
    with a hook on its communicator, so calls take the general path) or ``created``
    (``_create_torchcomm_process_group`` over a new communicator)."""
    rank, size = int(os.environ["TORCHCOMM_RANK"]), int(os.environ["TORCHCOMM_SIZE"])
    saved = dist.config.use_torchcomms
    dist.config.use_torchcomms = how in ("switched", "hooked")
    try:
        dist.init_process_group("gloo", store=_store(), rank=rank, world_size=size)
    finally:
        dist.config.use_torchcomms = saved
    pg = dist.group.WORLD
    comm = None
    if how == "created":  # beside a plain default group, as a program would have one
        from torchcomms.device_mesh import _create_torchcomm_process_group

        comm = torchcomms.new_comm("gloo", "cpu", name=unique_name("tagcomm"))
        pg = _create_torchcomm_process_group(comm, unique_name("tagpg"))
    assert (type(pg).__name__ == "_BackendWrapper") == (how != "plain"), type(pg)
    handle = pg.get_comm().register_pre_hook(lambda *a: None) if how == "hooked" else None
    try:
        yield pg
    finally:
        if handle is not None:
            handle.remove()
        dist.destroy_process_group()
        if comm is not None:
            comm.finalize()


HOWS = ("plain", "switched", "hooked", "created")


def _crossed(pg: Any, numel: int, blocking: bool) -> list[float] | None:
    """Rank 0 sends 1.0 under tag 7, then 2.0 under tag 9; rank 1 receives tag 9 first.

    Returns what rank 1's two receives got (first: tag 9's, second: tag 7's)."""
    peer = 1 - pg.rank()
    if pg.rank() == 0:
        a, b = torch.full((numel,), 1.0), torch.full((numel,), 2.0)
        works = [dist.isend(a, peer, group=pg, tag=7), dist.isend(b, peer, group=pg, tag=9)]
        for w in works:
            w.wait()
        return None
    first, second = torch.zeros(numel), torch.zeros(numel)
    if blocking:
        # Posted one at a time: recv(tag 9) blocks until its message arrived, although
        # tag 7's was sent first; then recv(tag 7) takes the message already there.
        dist.recv(first, peer, group=pg, tag=9)
        dist.recv(second, peer, group=pg, tag=7)
    else:
        works = [
            dist.irecv(first, peer, group=pg, tag=9),
            dist.irecv(second, peer, group=pg, tag=7),
        ]
        for w in works:
            w.wait()
    assert bool((first == first[0]).all()) and bool((second == second[0]).all())
    return [first[0].item(), second[0].item()]


def body_crossed_tags(numel: int, blocking: bool) -> dict[str, Any]:
    out = {}
    for how in HOWS:
        with _world(how) as pg:
            out[how] = _crossed(pg, numel, blocking)
    return out


@pytest.mark.parametrize(("numel", "blocking"), [(5, False), (BIG, True)])
def test_crossed_tags_match_as_on_plain_gloo(pool2, numel: int, blocking: bool) -> None:
    _, received = pool2.run(body_crossed_tags, numel, blocking)
    assert received["plain"] == [2.0, 1.0]  # gloo matches by tag: tag 9's message first
    assert received == {how: [2.0, 1.0] for how in HOWS}


def body_tagged_batch_and_any_source() -> dict[str, Any]:
    """``batch_isend_irecv`` with tags posted crosswise, and a tagged receive from any
    source, on each kind of group."""
    out: dict[str, Any] = {}
    for how in HOWS:
        with _world(how) as pg:
            me = pg.rank()
            peer = 1 - me
            sends = [torch.full((3,), 10.0 * me + 1), torch.full((3,), 10.0 * me + 2)]
            got = [torch.zeros(3), torch.zeros(3)]
            ops = [
                dist.P2POp(dist.isend, sends[0], peer, pg, tag=3),
                dist.P2POp(dist.isend, sends[1], peer, pg, tag=4),
                dist.P2POp(dist.irecv, got[0], peer, pg, tag=4),
                dist.P2POp(dist.irecv, got[1], peer, pg, tag=3),
            ]
            for w in dist.batch_isend_irecv(ops):
                w.wait()
            batch = [g[0].item() for g in got]
            anysrc: list[float] = []
            if me == 0:
                dist.send(torch.full((2,), 5.0), 1, group=pg, tag=11)
                dist.send(torch.full((2,), 6.0), 1, group=pg, tag=12)
            else:
                x, y = torch.zeros(2), torch.zeros(2)
                wy = pg.recv_anysource([y], 12)  # from any rank, but only tag 12
                wx = pg.recv_anysource([x], 11)
                wy.wait()
                wx.wait()
                anysrc = [y[0].item(), x[0].item(), wy._source_rank()]
            out[how] = {"batch": batch, "anysource": anysrc}
    return out


def test_tagged_batches_and_any_source_receives(pool2) -> None:
    results = pool2.run(body_tagged_batch_and_any_source)
    for rank, seen in enumerate(results):
        peer = 1 - rank
        want_batch = [10.0 * peer + 2, 10.0 * peer + 1]  # got[0] has tag 4: the peer's 2nd
        want_any = [6.0, 5.0, 0] if rank == 1 else []
        assert seen == {how: {"batch": want_batch, "anysource": want_any} for how in HOWS}


def test_a_backend_that_cannot_match_by_tag_refuses_a_tag() -> None:
    """The fake backend matches by order only: a nonzero tag is an error, never dropped;
    tag 0 runs as before."""
    from torchcomms.device_mesh import _create_torchcomm_process_group

    comm = torchcomms.new_comm("fake", "cpu", name=unique_name("notags"), hints={"size": "4"})
    try:
        assert comm.method_support()["send_tagged"] == "unsupported"
        pg = _create_torchcomm_process_group(comm, unique_name("notagpg"))
        t = torch.ones(4)
        for call in (dist.send, dist.recv, dist.isend, dist.irecv):
            with pytest.raises(NotImplementedError, match=r"tag=5.*cannot match messages by tag"):
                call(t, 1, group=pg, tag=5)
        with pytest.raises(NotImplementedError, match="tag=5"):
            dist.batch_isend_irecv([dist.P2POp(dist.isend, t, 1, pg, tag=5)])
        dist.send(t, 1, group=pg, tag=0)  # the plain send: still fine
        with pytest.raises((TypeError, ValueError), match="tag"):
            dist.send(t, 1, group=pg, tag=-1)
    finally:
        comm.finalize()


def test_gloo_reports_the_tag_capability() -> None:
    from torchcomms_core.spec import method_support
    from torchcomms_gloo import GlooBackend

    support = method_support(GlooBackend)
    assert support["send_tagged"] == support["recv_tagged"] == "native"
