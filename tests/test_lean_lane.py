"""The lean lane: plain synchronous calls skip the general path and lose nothing by it.

``all_reduce``, ``broadcast`` and ``all_to_all_single`` called synchronously with default
timeout and hints on plain contiguous CPU tensors go straight to the backend. These tests
show, on real gloo ranks, that such calls give the same results and works as the general
path, that hooks, state and bad arguments still send them down the general path, and that
an engine failure inside a lean call updates the communicator as before.
"""

from __future__ import annotations

import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name


def _comm():
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("lean"))


def _lean_calls(comm) -> dict[str, object]:
    """Run the three lean-lane operations once; their works and results."""
    r, n = comm.get_rank(), comm.get_size()
    t = torch.full((4,), float(r + 1))
    w_ar = comm.all_reduce(t, ReduceOp.SUM)
    b = torch.full((3,), float(r))
    w_bc = comm.broadcast(b, n - 1)
    inp = torch.arange(2 * n, dtype=torch.int64) + 100 * r
    out = torch.empty_like(inp)
    w_a2a = comm.all_to_all_single(out, inp)
    return {
        "all_reduce": (w_ar, t.tolist()),
        "broadcast": (w_bc, b.tolist()),
        "all_to_all_single": (w_a2a, out.tolist()),
    }


def _expected(r: int, n: int) -> dict[str, list]:
    return {
        "all_reduce": [float(n * (n + 1) // 2)] * 4,
        "broadcast": [float(n - 1)] * 3,
        "all_to_all_single": [100 * k + 2 * r + j for k in range(n) for j in range(2)],
    }


def body_results_and_works() -> dict:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    lean_before = comm._lean
    got = _lean_calls(comm)
    out = {}
    for op, (work, values) in got.items():
        out[op] = {
            "values_ok": values == _expected(r, n)[op],
            "status": work.status.name if hasattr(work, "status") else None,
            "completed": work.is_completed(),
            "wait": work.wait(),
        }
    comm.finalize()
    return {"lean": lean_before, "ops": out}


def body_hooks_switch_the_lane_off_and_on() -> dict:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    seen: list[str] = []
    posts: list[int] = []
    pre = comm.register_pre_hook(lambda name, op_id, args: seen.append(str(name)))
    post = comm.register_post_hook(lambda op_id, args: posts.append(op_id))
    hooked_lean = comm._lean
    got = _lean_calls(comm)
    hooked_ok = all(v == _expected(r, n)[op] for op, (_, v) in got.items())
    hooked_seen = list(seen)
    pre.remove()
    only_post_lean = comm._lean
    post.remove()
    seen.clear()
    posts.clear()
    unhooked_lean = comm._lean
    got = _lean_calls(comm)
    unhooked_ok = all(v == _expected(r, n)[op] for op, (_, v) in got.items())
    comm.finalize()
    return {
        "hooked_lean": hooked_lean,
        "hooked_seen": hooked_seen,
        "hooked_ok": hooked_ok,
        "only_post_lean": only_post_lean,
        "unhooked_lean": unhooked_lean,
        "unhooked_seen": list(seen),
        "unhooked_posts": list(posts),
        "unhooked_ok": unhooked_ok,
    }


def body_state_and_bad_arguments() -> dict:
    comm = _comm()
    n = comm.get_size()
    errors = {}
    cases = {
        "root_out_of_range": lambda: comm.broadcast(torch.ones(2), n),
        "root_not_int": lambda: comm.broadcast(torch.ones(2), "0"),
        "op_not_reduce_op": lambda: comm.all_reduce(torch.ones(2), "sum"),
        "bitwise_on_float": lambda: comm.all_reduce(torch.ones(2), ReduceOp.BAND),
        "a2a_uneven": lambda: comm.all_to_all_single(torch.empty(2 * n + 1), torch.ones(2 * n + 1)),
        "a2a_dtype": lambda: comm.all_to_all_single(
            torch.empty(2 * n, dtype=torch.int64), torch.ones(2 * n)
        ),
        "a2a_numel": lambda: comm.all_to_all_single(torch.empty(4 * n), torch.ones(2 * n)),
        "not_a_tensor": lambda: comm.all_reduce([1.0, 2.0], ReduceOp.SUM),
    }
    for case, call in cases.items():
        try:
            call()
            errors[case] = "no error"
        except (torchcomms.CommInputError, torchcomms.CommTypeError) as exc:
            errors[case] = type(exc).__name__
    # Non-contiguous tensors take the general path and still get their results.
    strided = torch.zeros(4, 2)[:, 0]
    strided.fill_(1.0)
    comm.all_reduce(strided, ReduceOp.SUM)
    strided_ok = strided.tolist() == [float(n)] * 4
    healthy = torch.ones(2)
    comm.all_reduce(healthy, ReduceOp.SUM)
    still_healthy = healthy.tolist() == [float(n)] * 2
    comm.finalize()
    after = {}
    for op, call in {
        "all_reduce": lambda: comm.all_reduce(torch.ones(2), ReduceOp.SUM),
        "broadcast": lambda: comm.broadcast(torch.ones(2), 0),
        "all_to_all_single": lambda: comm.all_to_all_single(torch.empty(n), torch.ones(n)),
    }.items():
        try:
            call()
            after[op] = "no error"
        except torchcomms.CommStateError:
            after[op] = "CommStateError"
    return {
        "errors": errors,
        "strided_ok": strided_ok,
        "healthy": still_healthy,
        "lean_after_finalize": comm._lean,
        "after": after,
    }


def body_engine_failure_marks_the_communicator() -> dict:
    """A peer that is gone makes a lean call fail the way the general path does."""
    comm = torchcomms.new_comm(
        "gloo", torch.device("cpu"), name=unique_name("lean-fail"), timeout=2.0
    )
    t = torch.ones(2)
    comm.all_reduce(t, ReduceOp.SUM)  # both ranks present
    if comm.get_rank() == 1:
        comm.abort()
        return {"rank": 1}
    err = None
    try:
        comm.all_reduce(t, ReduceOp.SUM)  # lean lane: rank 1 never comes
    except torchcomms.TorchCommError as exc:
        err = type(exc).__name__
    failed_after = None
    try:
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
    except torchcomms.CommStateError as exc:
        failed_after = "CommStateError" if "failed" in str(exc).lower() else str(exc)
    comm.abort()
    return {"rank": 0, "error": err, "after": failed_after}


def test_lean_calls_give_the_results_and_completed_works(pool) -> None:
    for res in pool.run(body_results_and_works):
        assert res["lean"] is True
        for op, r in res["ops"].items():
            assert r == {
                "values_ok": True,
                "status": "COMPLETED",
                "completed": True,
                "wait": True,
            }, op


def test_hooks_take_calls_off_the_lean_lane_until_removed(pool) -> None:
    for res in pool.run(body_hooks_switch_the_lane_off_and_on):
        assert res["hooked_lean"] is False
        assert res["hooked_seen"] == ["all_reduce", "broadcast", "all_to_all_single"]
        assert res["hooked_ok"] is True
        assert res["only_post_lean"] is False  # one hook left is enough
        assert res["unhooked_lean"] is True
        assert res["unhooked_seen"] == [] and res["unhooked_posts"] == []
        assert res["unhooked_ok"] is True


def test_bad_arguments_and_dead_communicators_still_get_the_general_errors(pool) -> None:
    for res in pool.run(body_state_and_bad_arguments):
        assert res["errors"] == {
            "root_out_of_range": "CommInputError",
            "root_not_int": "CommTypeError",
            "op_not_reduce_op": "CommTypeError",
            "bitwise_on_float": "CommInputError",
            "a2a_uneven": "CommInputError",
            "a2a_dtype": "CommInputError",
            "a2a_numel": "CommInputError",
            "not_a_tensor": "CommTypeError",
        }
        assert res["strided_ok"] and res["healthy"]
        assert res["lean_after_finalize"] is False
        assert res["after"] == dict.fromkeys(
            ("all_reduce", "broadcast", "all_to_all_single"), "CommStateError"
        )


def test_an_engine_failure_in_a_lean_call_fails_the_communicator(pool2) -> None:
    res = {r["rank"]: r for r in pool2.run(body_engine_failure_marks_the_communicator, timeout=60)}
    assert res[0]["error"] in ("CommTimeoutError", "CommOperationError"), res[0]
    assert res[0]["after"] == "CommStateError", res[0]
