"""Failures never hang: dead peers, absent peers and mismatched collectives end in errors.

Each body uses a short communicator timeout and reports how long the failure took.
"""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name

TIMEOUT_S = 4.0


def _comm(**kwargs):
    return torchcomms.new_comm(
        "gloo",
        torch.device("cpu"),
        name=unique_name("fault"),
        timeout=timedelta(seconds=TIMEOUT_S),
        **kwargs,
    )


def body_peer_killed_mid_loop(victim: int) -> dict:
    comm = _comm()
    r = comm.get_rank()
    t = torch.ones(1024)
    last_ok = time.monotonic()
    for i in range(1000):
        if r == victim and i == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            comm.all_reduce(t, ReduceOp.SUM)
            t.fill_(1)
            last_ok = time.monotonic()
        except torchcomms.TorchCommError as exc:
            return {
                "iteration": i,
                "seconds": time.monotonic() - last_ok,
                "error": type(exc).__name__,
                "message": str(exc),
                "status": "failed-state" if _is_failed(comm) else "?",
            }
    return {"iteration": -1}


def _is_failed(comm) -> bool:
    try:
        comm.barrier()
    except torchcomms.CommStateError as exc:
        return "failed earlier" in str(exc)
    return False


def test_survivors_raise_when_a_peer_is_killed(pool) -> None:
    victim = pool.world_size - 1
    outcomes = pool.run_outcomes(body_peer_killed_mid_loop, victim, timeout=60)
    assert outcomes[victim].status == "died"
    for o in outcomes[:victim]:
        assert o.ok, o.error
        res = o.value
        assert res["iteration"] == 20, res
        assert res["seconds"] < TIMEOUT_S + 5, res
        assert res["error"] in ("CommOperationError", "CommTimeoutError"), res
        assert "all_reduce on communicator" in res["message"]
        assert res["status"] == "failed-state"


def body_peer_never_joins() -> dict:
    if torchcomms_rank() != 0:
        return {"skipped": True}
    start = time.monotonic()
    try:
        _comm()
    except Exception as exc:  # what type: see the assertion
        return {
            "seconds": time.monotonic() - start,
            "error": type(exc).__name__,
            "message": str(exc),
        }
    return {"seconds": time.monotonic() - start, "error": None}


def torchcomms_rank() -> int:
    return int(os.environ["TORCHCOMM_RANK"])


def test_peer_that_never_joins_fails_creation_within_the_timeout(pool2) -> None:
    res = pool2.run(body_peer_never_joins, timeout=60)[0]
    assert res["error"] == "CommTimeoutError", res
    assert "Every rank must call new_comm with the same name" in res["message"]
    assert res["seconds"] < TIMEOUT_S + 5, res


def body_mismatched_sizes() -> dict:
    comm = _comm()
    r = comm.get_rank()
    start = time.monotonic()
    try:
        comm.all_reduce(torch.ones(4 if r == 0 else 8), ReduceOp.SUM)
    except torchcomms.TorchCommError as exc:
        return {
            "seconds": time.monotonic() - start,
            "error": type(exc).__name__,
            "message": str(exc),
        }
    return {"seconds": time.monotonic() - start, "error": None}


def test_mismatched_collective_sizes_never_hang(pool2) -> None:
    # Gloo aborts the process that receives more bytes than it expects; the other rank
    # sees its peer vanish and raises. Nobody hangs.
    outcomes = pool2.run_outcomes(body_mismatched_sizes, timeout=30)
    for o in outcomes:
        assert o.status in ("ok", "died"), o
        if o.ok:
            assert o.value["error"] is not None and o.value["seconds"] < TIMEOUT_S + 5, o.value


def test_mismatch_check_names_every_rank_call(monkeypatch) -> None:
    from torchcomms_core.testing import RankPool

    with RankPool(2, env={"TORCHCOMM_CHECK_COLLECTIVES": "1"}) as checked:
        for res in checked.run(body_mismatched_sizes, timeout=60):
            assert res["error"] == "CommInputError", res
            assert (
                "rank 0: all_reduce float32 numel=4 RedOpType.SUM; "
                "rank 1: all_reduce float32 numel=8 RedOpType.SUM"
            ) in res["message"]
        assert checked.run(body_checked_ops_still_work) == [4.0, 4.0]


def body_checked_ops_still_work() -> float:
    comm = _comm()
    t = torch.full((3,), float(comm.get_rank() + 1))
    comm.all_reduce(t, ReduceOp.SUM)
    out = torch.empty(6)
    comm.all_gather_single(out, t)
    comm.barrier()
    comm.finalize()
    return float(out.sum() / 6 + 1)


def body_mismatched_ops() -> dict:
    comm = _comm()
    r = comm.get_rank()
    start = time.monotonic()
    try:
        if r == 0:
            comm.all_reduce(torch.ones(4), ReduceOp.SUM)
        else:
            comm.recv(torch.ones(4), 0)
    except torchcomms.TorchCommError as exc:
        return {"seconds": time.monotonic() - start, "error": type(exc).__name__}
    return {"seconds": time.monotonic() - start, "error": None}


def test_mismatched_operations_error_instead_of_hanging(pool2) -> None:
    for res in pool2.run(body_mismatched_ops, timeout=60):
        assert res["error"] is not None, res
        assert res["seconds"] < TIMEOUT_S + 5, res


def body_per_call_timeout() -> dict:
    comm = _comm()
    if comm.get_rank() == 1:
        time.sleep(3)
        return {"slept": True}
    start = time.monotonic()
    work = comm.recv(torch.empty(1), 1, async_op=True, timeout=timedelta(seconds=1))
    try:
        work.wait()
    except torchcomms.CommTimeoutError as exc:
        return {
            "seconds": time.monotonic() - start,
            "status": work.status.name,
            "message": str(exc),
        }
    return {"seconds": time.monotonic() - start, "status": work.status.name}


def test_per_call_timeout_overrides_the_default(pool2) -> None:
    res = pool2.run(body_per_call_timeout, timeout=60)[0]
    assert res["status"] == "TIMEDOUT", res
    assert res["seconds"] < 1 + 3, res
    assert "timed out" in res["message"] and "TORCHCOMM_TIMEOUT_SECONDS" in res["message"]


def body_abort_process() -> None:
    comm = _comm(abort_process_on_timeout_or_error=True)
    if comm.get_rank() == 0:
        comm.recv(torch.empty(1), 1, timeout=timedelta(seconds=1))
    else:
        time.sleep(3)


def test_abort_process_on_timeout_ends_the_process(pool2) -> None:
    outcomes = pool2.run_outcomes(body_abort_process, timeout=30)
    assert outcomes[0].status == "died" and outcomes[0].exitcode == -signal.SIGABRT
