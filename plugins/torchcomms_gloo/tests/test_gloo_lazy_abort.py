"""abort() of a gloo communicator unblocks operations in flight when its engine connects
peers lazily (hint ``lazy``), and leaves the other gloo communicators of the process alone.

Rank 0 starts an operation its peers never join; the peers stay alive (waiting on a second
communicator), so nothing but abort can end rank 0's operation before its 60 s timeout.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name

TIMEOUT_S = 60.0  # the communicators' timeout: an operation abort failed to end lasts this
BOUND_S = 15.0  # "well before the timeout": a correctness bound, not a speed goal


def _comm(lazy: bool, prefix: str) -> torchcomms.TorchComm:
    return torchcomms.new_comm(
        "gloo",
        torch.device("cpu"),
        name=unique_name(prefix),
        timeout=timedelta(seconds=TIMEOUT_S),
        abort_process_on_timeout_or_error=False,
        hints={"lazy": "true" if lazy else "false"},
    )


def _aborted(exc: BaseException) -> str:
    return "aborted" if "aborted" in str(exc) else f"{type(exc).__name__}: {exc}"


def body_abort_unblocks_pending_work(lazy: bool, settle_s: float) -> dict:
    """Rank 0 aborts an all_reduce nobody else joins, ``settle_s`` after issuing it."""
    side = _comm(False, "side")  # where the peers wait for rank 0 to finish
    comm = _comm(lazy, "lazy-abort")
    rank = comm.get_rank()
    out: dict = {"at_creation": comm.get_backend_impl().connections_at_creation}
    if rank == 0:
        t0 = time.monotonic()
        work = comm.all_reduce(torch.ones(1 << 10), ReduceOp.SUM, True)  # nobody joins
        time.sleep(settle_s)
        # Peers the engine contacted on first use (read their address): it either connected
        # to them or waits for them to connect.
        out["contacted"] = len(comm.get_backend_impl()._addresses.snapshot()[1])
        comm.abort()
        try:
            work.wait()
            out["wait"] = "completed"
        except torchcomms.TorchCommError as exc:
            out["wait"] = _aborted(exc)
        out["op_s"] = time.monotonic() - t0
    side.barrier()  # the peers stay alive until rank 0's operation has ended
    if rank != 0:
        comm.abort()  # nothing in flight here: returns at once
    out["side_ok"] = _healthy(side)
    side.finalize()
    return out


def test_abort_unblocks_an_operation_a_peer_never_joins_lazy(pool) -> None:
    results = pool.run(body_abort_unblocks_pending_work, True, 0.5, timeout=TIMEOUT_S + 30)
    rank0 = results[0]
    # Lazy: nothing connected at creation (the peers never use the communicator, so rank 0's
    # count cannot include a connection a faster rank opened meanwhile).
    assert rank0["at_creation"] == 0
    assert rank0["contacted"] >= 1  # the operation contacted its peers on first use
    assert rank0["wait"] == "aborted"
    assert rank0["op_s"] < BOUND_S, rank0
    assert all(r["side_ok"] for r in results)


def test_abort_right_after_issuing_lazy(pool2) -> None:
    # Abort while the engine may still be reading the peer's address or connecting to it.
    for _ in range(3):
        rank0 = pool2.run(body_abort_unblocks_pending_work, True, 0.0, timeout=TIMEOUT_S + 30)[0]
        assert rank0["wait"] == "aborted"
        assert rank0["op_s"] < BOUND_S, rank0


def test_abort_unblocks_an_operation_eager(pool) -> None:
    results = pool.run(body_abort_unblocks_pending_work, False, 0.5, timeout=TIMEOUT_S + 30)
    rank0 = results[0]
    assert all(r["at_creation"] == pool.world_size - 1 for r in results)  # the full mesh
    assert rank0["wait"] == "aborted"
    assert rank0["op_s"] < BOUND_S, rank0


def _healthy(comm: torchcomms.TorchComm) -> bool:
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    return bool(torch.equal(t, torch.full((3,), float(comm.get_size()))))


def body_abort_from_a_watchdog_thread() -> dict:
    """A sync call blocked on a peer that never joins, aborted from another thread."""
    side = _comm(False, "side")
    comm = _comm(True, "lazy-watchdog")
    rank = comm.get_rank()
    out: dict = {}
    if rank == 0:
        timer = threading.Timer(0.5, comm.abort)
        timer.start()
        t0 = time.monotonic()
        try:
            comm.all_reduce(torch.ones(8), ReduceOp.SUM)
            out["call"] = "completed"
        except torchcomms.TorchCommError as exc:
            out["call"] = _aborted(exc)
        out["call_s"] = time.monotonic() - t0
        timer.join()
    side.barrier()
    if rank != 0:
        comm.abort()
    side.finalize()
    return out


def test_abort_from_a_watchdog_thread_unblocks_a_sync_call_lazy(pool2) -> None:
    rank0 = pool2.run(body_abort_from_a_watchdog_thread, timeout=TIMEOUT_S + 30)[0]
    assert rank0["call"] == "aborted"
    assert rank0["call_s"] < BOUND_S, rank0


def body_other_communicator_survives(lazy_other: bool) -> dict:
    """Two lazy communicators (and a split) connected to the same peers; rank 0 aborts one
    with an operation in flight: the others keep their connections and keep working."""
    side = _comm(False, "side")
    first = _comm(True, "lazy-first")
    other = _comm(lazy_other, "lazy-other")
    assert _healthy(first) and _healthy(other)  # both connected to their peers now
    child = other.split(list(range(other.get_size())), name=unique_name("lazy-child"))
    assert child is not None and _healthy(child)
    other_open = len(other.get_backend_impl().peer_connections())
    child_open = len(child.get_backend_impl().peer_connections())
    out: dict = {"other_open": other_open, "child_open": child_open}
    rank = first.get_rank()
    if rank == 0:
        work = first.all_reduce(torch.ones(4), ReduceOp.SUM, True)  # nobody joins
        time.sleep(0.5)
        first.abort()
        try:
            work.wait()
            out["first"] = "completed"
        except torchcomms.TorchCommError as exc:
            out["first"] = _aborted(exc)
    side.barrier()  # rank 0 has aborted ``first``
    if rank != 0:
        first.abort()
    out["other_open_after"] = len(other.get_backend_impl().peer_connections())
    out["child_open_after"] = len(child.get_backend_impl().peer_connections())
    out["other_ok"] = all(_healthy(other) for _ in range(3))
    out["child_ok"] = _healthy(child)
    child.finalize()
    other.finalize()
    side.finalize()
    return out


def test_a_second_communicator_keeps_working_after_the_first_is_aborted(pool) -> None:
    results = pool.run(body_other_communicator_survives, True, timeout=TIMEOUT_S + 30)
    assert results[0]["first"] == "aborted"
    for r in results:
        assert r["other_open"] >= 1 and r["child_open"] >= 1
        assert r["other_open_after"] == r["other_open"]  # none of its sockets was touched
        assert r["child_open_after"] == r["child_open"]
        assert r["other_ok"] and r["child_ok"]


def test_an_eager_communicator_keeps_working_after_a_lazy_one_is_aborted(pool2) -> None:
    results = pool2.run(body_other_communicator_survives, False, timeout=TIMEOUT_S + 30)
    assert results[0]["first"] == "aborted"
    for r in results:
        assert r["other_open_after"] == r["other_open"] == 1
        assert r["other_ok"] and r["child_ok"]


def body_connection_accepted_meanwhile(_: int) -> dict:
    """While rank 0 builds an eager communicator, rank 1 starts using an older lazy one, so
    rank 0's lazy engine accepts a connection in the middle of the eager build."""
    side = _comm(False, "side")
    first = _comm(True, "lazy-older")
    rank = first.get_rank()
    side.barrier()
    sender = None
    if rank == 1:
        time.sleep(0.3)  # rank 0 is building ``other`` by now, waiting for this rank
        # The first send connects to rank 0's listener, and waits for rank 0 to use ``first``.
        sender = threading.Thread(target=first.send, args=(torch.ones(4), 0))
        sender.start()
        time.sleep(1.0)  # rank 0's lazy engine may accept meanwhile
    other = _comm(False, "eager-newer")
    out: dict = {"other_open": len(other.get_backend_impl().peer_connections())}
    if rank == 0:
        got = torch.zeros(4)
        first.recv(got, 1)
        out["received"] = got.tolist()
    else:
        assert sender is not None
        sender.join()
    side.barrier()
    first.abort()  # closes ``first``'s connections: none of them is ``other``'s
    side.barrier()
    out["other_open_after"] = len(other.get_backend_impl().peer_connections())
    out["other_ok"] = all(_healthy(other) for _ in range(3))
    other.finalize()
    side.finalize()
    return out


def test_an_eager_build_does_not_take_a_connection_an_older_engine_accepts_meanwhile(
    pool2,
) -> None:
    # When rank 0's lazy engine accepts rank 1's connection during the eager build (in
    # about half the runs here), the eager engine must not record it as its own.
    results = pool2.run(body_connection_accepted_meanwhile, 0, timeout=TIMEOUT_S + 30)
    assert results[0]["received"] == [1.0] * 4
    for r in results:
        assert r["other_open"] == 1  # its own connection only
        assert r["other_open_after"] == 1 and r["other_ok"]
