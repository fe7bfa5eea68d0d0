"""Init handles that carry their own rendezvous (``enable_reconfigure=True``, no store).

The handle names a store its communicator hosts; members meet in the first handle's, so
no launcher, no shared store and no fixed process is needed. Covered: the handle's form,
many communicators of one name in one process (threads), shrink then grow at 4 ranks, the
first handle's member SIGKILLed, a dead member failing the call at once, and clear errors
for foreign, malformed or unreachable handles that leave the communicator usable.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core import method_support
from torchcomms_core.testing import RankPool, current_rank, unique_name

TIMEOUT_S = 5.0
# Rounds that must succeed get room for a loaded machine; failures are timed separately.
SETUP = timedelta(seconds=30)
HANDLE = re.compile(r"^gloo:\d+:[0-9a-f]{32}:[^:]+:\d+$")


def _comm(name: str, **kw):
    return torchcomms.new_comm(
        "gloo",
        "cpu",
        name=name,
        enable_reconfigure=True,
        timeout=timedelta(seconds=TIMEOUT_S),
        **kw,
    )


def _sum(comm, value: float = 1.0) -> float:
    t = torch.full((4,), value)
    comm.all_reduce(t, ReduceOp.SUM, False)
    return float(t[0])


def _exchange(tag: str, handle: str, ranks: list[int]) -> list[str]:
    """Out-of-band handle exchange through the pool's store (the application's part)."""
    from torch.distributed import TCPStore

    store = TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.set(f"{tag}/{current_rank()}", handle)
    return [store.get(f"{tag}/{r}").decode() for r in ranks]


# -- in one process ----------------------------------------------------------------------------


def test_new_comm_needs_no_store_or_launcher() -> None:
    code = (
        "import torchcomms, torch\n"
        "c = torchcomms.new_comm('gloo', 'cpu', name='solo', enable_reconfigure=True)\n"
        "h = c.get_init_handle(); c.reconfigure(1, [h])\n"
        "t = torch.ones(2); c.all_reduce(t, torchcomms.ReduceOp.SUM, False)\n"
        "print(h, c.get_rank(), c.get_size(), t.tolist()); c.finalize()\n"
    )
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "TORCHCOMM_RANK",
                "TORCHCOMM_SIZE", "TORCHCOMM_STORE_PATH")  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in launcher}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr[-3000:]
    handle, rank, size, values = out.stdout.split(" ", 3)
    assert HANDLE.match(handle), handle
    assert (rank, size, values.strip()) == ("0", "1", "[1.0, 1.0]")


def test_many_communicators_of_one_name_in_one_process() -> None:
    n = 4
    comms = [_comm("ft0") for _ in range(n)]
    handles = [c.get_init_handle() for c in comms]
    assert all(HANDLE.match(h) for h in handles) and len(set(handles)) == n
    assert len({h.rsplit(":", 1)[1] for h in handles}) == n  # a rendezvous each
    seen: dict[tuple[int, int], tuple[int, int, float]] = {}
    errors: list[BaseException] = []

    def member(i: int, uuid: int, members: list[int]) -> None:
        try:
            c = comms[i]
            c.reconfigure(uuid, [handles[m] for m in members], SETUP)
            seen[(uuid, i)] = (c.get_rank(), c.get_size(), _sum(c, i + 1.0))
        except BaseException as exc:
            errors.append(exc)

    # All four, then down to three (the first handle's member left), then back up in a new
    # order: the last step is the shrink-then-grow that used to fail building the engine.
    for uuid, members in ((1, [0, 1, 2, 3]), (2, [1, 2, 3]), (3, [3, 2, 1, 0])):
        threads = [threading.Thread(target=member, args=(i, uuid, members)) for i in members]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
    for i in range(n):
        assert seen[(1, i)] == (i, 4, 10.0)
        assert seen[(3, i)] == (3 - i, 4, 10.0)
    assert [seen[(2, i)] for i in (1, 2, 3)] == [(0, 3, 9.0), (1, 3, 9.0), (2, 3, 9.0)]
    for c in comms:
        c.finalize()


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: nothing listens there


def test_foreign_malformed_and_unreachable_handles_fail_clearly_and_leave_it_usable() -> None:
    comm = _comm(unique_name("bad"))
    mine = comm.get_init_handle()
    token = "0" * 32
    cases = [
        (f"ncclx:0:{token}:localhost:1234", torchcomms.CommInputError, "comes from a 'ncclx'"),
        ("not-a-handle", torchcomms.CommInputError, "gloo:<rank>:<token>:<host>:<port>"),
        (f"gloo:0:{token}", torchcomms.CommInputError, "created with store="),
        (f"gloo:0:{token}:localhost:99999", torchcomms.CommInputError, "not a handle"),
    ]
    for handle, error, text in cases:
        with pytest.raises(error, match=re.escape(text)) as info:
            comm.reconfigure(f"u-{len(handle)}", [handle, mine])
        assert handle in str(info.value)
    # Unreachable first handles: refused (the member exited) and a host that does not
    # resolve fail at once; each consumes its uuid, and the communicator stays usable.
    refused = f"gloo:0:{token}:127.0.0.1:{_refused_port()}"
    unresolvable = f"gloo:0:{token}:no-such-host.invalid:1234"
    for uuid, handle, text in (("r1", refused, "connection refused"),
                               ("r2", unresolvable, "does not resolve")):  # fmt: skip
        start = time.monotonic()
        with pytest.raises(torchcomms.CommOperationError, match=text) as info:
            comm.reconfigure(uuid, [handle, mine], timeout=timedelta(seconds=3))
        assert handle in str(info.value) and time.monotonic() - start < 3 + 1
    with pytest.raises(torchcomms.CommStateError, match="call comm.reconfigure"):
        _sum(comm)
    comm.reconfigure("ok", [mine])
    assert _sum(comm) == 1.0
    comm.finalize()


def test_store_given_at_creation_keeps_store_handles() -> None:
    from torch.distributed import HashStore

    comm = _comm(unique_name("st"), store=HashStore())
    handle = comm.get_init_handle()
    assert re.match(r"^gloo:\d+:[0-9a-f]{32}$", handle), handle
    comm.reconfigure(1, [handle])
    assert _sum(comm) == 1.0
    comm.finalize()


def test_backends_without_reconfigure_say_which_can() -> None:
    with pytest.raises(RuntimeError) as info:
        torchcomms.new_comm("mpi", "cpu", name=unique_name("m"), enable_reconfigure=True)
    msg = str(info.value)
    assert "MPICH has no fault-tolerant communicators" in msg and "'gloo'" in msg
    from torchcomms_ncclx import NCCLXBackend

    ok, reason = NCCLXBackend.reconfigure_support()
    if not torch.distributed.is_nccl_available():
        assert not ok and "ProcessGroupNCCL" in reason
        assert method_support(NCCLXBackend)["reconfigure_engine"] == "unsupported"


# -- across processes (4 ranks) ----------------------------------------------------------------


def body_down_then_up() -> dict:
    name = unique_name("du")
    comm = _comm(name)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(name, comm.get_init_handle(), list(range(n)))
    comm.reconfigure(1, handles, SETUP)
    out: dict = {"full": _sum(comm)}
    if r < n - 1:  # the last rank sits the middle round out and asks for the last at once
        comm.reconfigure(2, handles[: n - 1], SETUP)
        out["down"] = (comm.get_size(), _sum(comm))
    comm.reconfigure(3, handles, SETUP)
    out["up"] = (comm.get_rank(), comm.get_size(), _sum(comm))
    # A split of the new group meets in the group's rendezvous, not in a private store.
    half = [0, 1] if comm.get_rank() < 2 else [2, 3]
    sub = comm.split(half, "half")
    out["split"] = (sub.get_size(), _sum(sub, comm.get_rank() + 1.0))
    sub.finalize()
    comm.finalize()
    return out


def test_shrink_then_grow_at_4_ranks_with_self_hosted_handles(pool4: RankPool) -> None:
    results = pool4.run(body_down_then_up, timeout=90)
    for r, res in enumerate(results):
        assert res["full"] == 4.0
        assert res["up"] == (r, 4, 4.0)
        assert res["split"] == (2, 3.0 if r < 2 else 7.0)
        if r < 3:
            assert res["down"] == (3, 3.0)


def body_first_handle_dies() -> dict:
    name = unique_name("fh")
    comm = _comm(name)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(name, comm.get_init_handle(), list(range(n)))
    comm.reconfigure("all", handles, SETUP)
    assert _sum(comm) == n
    if r == 0:  # hosts the rendezvous everyone met in
        os.kill(os.getpid(), signal.SIGKILL)
    out: dict = {}
    try:
        for _ in range(100):
            _sum(comm)
    except torchcomms.TorchCommError as exc:
        out["detected"] = type(exc).__name__
    start = time.monotonic()
    # Whoever lists the dead member fails fast: its rendezvous refuses connections.
    try:
        comm.reconfigure("with-dead", handles[1:] + handles[:1])
    except torchcomms.CommOperationError as exc:
        out["with_dead"] = (str(exc), time.monotonic() - start)
    comm.reconfigure("survivors", handles[1:], SETUP)  # meets in rank 1's rendezvous now
    out["after"] = (comm.get_rank(), comm.get_size(), _sum(comm))
    comm.finalize()
    return out


def test_first_handle_member_sigkilled_survivors_meet_at_the_next_handle(pool4: RankPool) -> None:
    grace, pool4.grace_s = pool4.grace_s, 60.0
    try:
        outcomes = pool4.run_outcomes(body_first_handle_dies, timeout=90)
    finally:
        pool4.grace_s = grace
    assert outcomes[0].status == "died", outcomes[0].error
    for o in outcomes[1:]:
        assert o.ok, o.error
        res = o.value
        assert res["detected"] in ("CommOperationError", "CommTimeoutError")
        text, seconds = res["with_dead"]
        assert "has exited" in text and seconds < TIMEOUT_S, res
        assert res["after"] == (o.rank - 1, 3, 3.0)


def body_first_member_leaves() -> dict:
    name = unique_name("fl")
    comm = _comm(name)
    r, n = current_rank(), int(os.environ["TORCHCOMM_SIZE"])
    handles = _exchange(name, comm.get_init_handle(), list(range(n)))
    if r == 0:  # hosts the rendezvous, but leaves instead of reconfiguring
        time.sleep(0.5)
        comm.finalize()
        del comm
        return {}
    start = time.monotonic()
    try:
        comm.reconfigure("left", handles, timedelta(seconds=20))
        return {"error": None}
    except torchcomms.TorchCommError as exc:
        return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.monotonic() - start}
    finally:
        comm.finalize()


def test_first_member_leaving_fails_the_others_well_before_the_timeout(pool4: RankPool) -> None:
    for res in pool4.run(body_first_member_leaves, timeout=60)[1:]:
        assert res["error"].startswith("CommOperationError"), res
        assert "has exited" in res["error"] or "rendezvous store" in res["error"], res
        assert res["seconds"] < 10, res
