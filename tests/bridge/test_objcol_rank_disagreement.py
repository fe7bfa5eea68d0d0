"""Object collectives when ranks disagree: every rank raises the same clear error, nobody waits.

Communicators here get a 300 s timeout while each body must finish within 60 s, so a rank
left waiting for a peer that gave up shows as a hung body, not as a slow pass.
"""

from __future__ import annotations

from datetime import timedelta

import torch

import torchcomms
from torchcomms import objcol
from torchcomms_core.comm import objcol as core_objcol
from torchcomms_core.testing import unique_name

LONG = timedelta(seconds=300)
TIB = 1 << 40


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hobj"), timeout=LONG)


def _still_usable(comm) -> float:
    t = torch.ones(2)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    return t[0].item()


def _caught(fn, *args, **kwargs) -> tuple[str, str]:
    try:
        fn(*args, **kwargs)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return "no error", ""


# -- point to point ----------------------------------------------------------------------


def body_recv_slots(slots: int) -> dict:
    comm = _comm()
    r = comm.get_rank()
    out: dict = {}
    if r == 0:
        out["error"] = _caught(objcol.send_object_list, comm, [{"a": 1}, "two"], 1)
    elif r == 1:
        got = ["untouched"] * slots
        out["error"] = _caught(objcol.recv_object_list, comm, got, 0)
        out["list"] = got
    out["sum"] = _still_usable(comm)
    # The same pair then exchanges correctly.
    if r == 0:
        objcol.send_object_list(comm, [{"a": 1}, "two"], 1)
    elif r == 1:
        got = [None, None]
        objcol.recv_object_list(comm, got, 0)
        out["after"] = got
    comm.finalize()
    return out


def test_recv_with_a_different_number_of_slots_raises_on_both_ranks(pool2) -> None:
    for slots in (3, 1):
        sender, receiver = pool2.run(body_recv_slots, slots, timeout=60)
        assert sender["error"][0] == "CommInputError", sender
        assert receiver["error"][0] == "CommInputError", receiver
        assert f"rank 1 expects {slots} objects but this rank sent 2" in sender["error"][1]
        assert f"rank 0 sent 2 objects but object_list has {slots} slots" in receiver["error"][1]
        assert "Pass a list of 2 slots" in receiver["error"][1]
        assert receiver["list"] == ["untouched"] * slots  # nothing decoded from garbage
        assert sender["sum"] == receiver["sum"] == 2.0
        assert receiver["after"] == [{"a": 1}, "two"]


def body_hostile_sender() -> dict:
    comm = _comm()
    out: dict = {}
    if comm.get_rank() == 0:
        # A peer that declares one object of 1 TiB, as a hostile or broken rank could.
        header = torch.tensor([1, core_objcol._OK, TIB, 0], dtype=torch.int64)
        comm.send(header, 1)
        verdict = torch.zeros(2, dtype=torch.int64)
        comm.recv(verdict, 1)
        out["verdict"] = verdict.tolist()
    else:
        got = [None]
        out["error"] = _caught(objcol.recv_object_list, comm, got, 0)
    out["sum"] = _still_usable(comm)
    comm.finalize()
    return out


def test_a_peer_declaring_a_tebibyte_is_refused_before_allocating(pool2) -> None:
    sender, receiver = pool2.run(body_hostile_sender, timeout=60)
    kind, message = receiver["error"]
    assert kind == "CommInputError"
    assert f"declared {TIB} bytes" in message and "TORCHCOMM_OBJCOL_MAX_BYTES" in message
    assert sender["verdict"] == [core_objcol._TOO_LARGE, 2 << 30]
    assert receiver["sum"] == 2.0


# -- collectives -------------------------------------------------------------------------


def body_broadcast_lengths() -> dict:
    comm = _comm()
    r = comm.get_rank()
    lst = [{"k": 1}, "two", torch.ones(2)] if r == 0 else [None] * (2 if r == 1 else 3)
    error = _caught(objcol.broadcast_object_list, comm, lst, root=0)
    sum_ = _still_usable(comm)
    ok = ["x", 7] if r == 0 else [None, None]
    objcol.broadcast_object_list(comm, ok, root=0)
    comm.finalize()
    return {"error": error, "sum": sum_, "after": ok, "kept": lst[0] if r else None}


def test_broadcast_with_different_lengths_raises_on_every_rank(pool) -> None:
    n = pool.world_size
    for r, out in enumerate(pool.run(body_broadcast_lengths, timeout=60)):
        kind, message = out["error"]
        assert kind == "CommInputError", (r, out)
        assert "root rank 0 has 3 entries and rank 1 has 2" in message
        assert "Pass a list of 3 entries on every rank" in message
        assert out["sum"] == float(n)
        assert out["after"] == ["x", 7]
        if r:
            assert out["kept"] is None  # nothing was written into a receiver's list


def body_size_limit() -> dict:
    comm = _comm()
    r = comm.get_rank()
    big = "x" * 64_000
    if r == 1:  # one rank lowers the limit: every rank must follow it together
        import os

        os.environ["TORCHCOMM_OBJCOL_MAX_BYTES"] = "4K"
    try:
        out = {
            "broadcast": _caught(
                objcol.broadcast_object_list, comm, [big] if r == 0 else [None], root=0
            ),
            "all_gather": _caught(
                objcol.all_gather_object, comm, [None] * comm.get_size(), big if r == 0 else r
            ),
        }
        small = ["fits"] if r == 0 else [None]
        objcol.broadcast_object_list(comm, small, root=0)
        out["small"] = small[0]
    finally:
        import os

        os.environ.pop("TORCHCOMM_OBJCOL_MAX_BYTES", None)
    comm.finalize()
    return out


def test_the_size_limit_is_configurable_and_refused_on_every_rank(pool2) -> None:
    for out in pool2.run(body_size_limit, timeout=60):
        for op in ("broadcast", "all_gather"):
            kind, message = out[op]
            assert kind == "CommInputError", (op, out)
            assert "over the limit of 4096 bytes (TORCHCOMM_OBJCOL_MAX_BYTES on rank 1)" in message
            assert "rank 0 declared" in message
        assert out["small"] == "fits"


def body_one_rank_refuses() -> dict:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    out = {
        # Rank 1 passes a list of the wrong length; the others must not wait for it.
        "all_gather": _caught(objcol.all_gather_object, comm, [None] * (n + 1 if r == 1 else n), r),
        # The root cannot serialize its object.
        "broadcast": _caught(
            objcol.broadcast_object_list, comm, [lambda: 0] if r == 0 else [None], root=0
        ),
        # The root forgets its input list.
        "scatter": _caught(objcol.scatter_object_list, comm, n - 1, [None], None),
        # The root passes no list to gather into.
        "gather": _caught(objcol.gather_object, comm, r, 0, None),
    }
    gathered = [None] * n
    objcol.all_gather_object(comm, gathered, r)
    out["after"] = gathered
    comm.finalize()
    return out


def test_a_rank_that_refuses_its_arguments_makes_every_rank_raise(pool4) -> None:
    results = pool4.run(body_one_rank_refuses, timeout=60)
    for r, out in enumerate(results):
        kind, message = out["all_gather"]
        assert kind == "CommInputError", (r, out)
        if r == 1:
            assert "object_list has 5 entries but must have one per rank (4)" in message
        else:
            assert "rank(s) 1 refused their arguments" in message
        kind, message = out["broadcast"]
        assert kind != "no error", (r, out)
        if r:
            assert kind == "CommInputError" and "rank(s) 0 refused" in message
        kind, message = out["scatter"]
        if r == 3:
            assert kind == "CommTypeError" and "scatter_object_input_list must be a list" in message
        else:
            assert kind == "CommInputError" and "rank(s) 3 refused" in message
        kind, message = out["gather"]
        if r == 0:
            assert kind == "CommTypeError" and "object_gather_list must be a list" in message
        else:
            assert kind == "CommInputError" and "rank(s) 0 refused" in message
        assert out["after"] == [0, 1, 2, 3]
