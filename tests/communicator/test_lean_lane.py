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
    lean_before = comm.takes_lean_calls()
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
    hooked_lean = comm.takes_lean_calls()
    got = _lean_calls(comm)
    hooked_ok = all(v == _expected(r, n)[op] for op, (_, v) in got.items())
    hooked_seen = list(seen)
    pre.remove()
    only_post_lean = comm.takes_lean_calls()
    post.remove()
    seen.clear()
    posts.clear()
    unhooked_lean = comm.takes_lean_calls()
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
        "lean_after_finalize": comm.takes_lean_calls(),
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


# -- nested tensors ----------------------------------------------------------------------------


def body_nested_tensors_are_refused() -> dict:
    """A nested tensor is strided, contiguous and on the CPU, yet no dense buffer: refused."""
    import warnings

    comm = _comm()
    n = comm.get_size()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype feature
        nested = torch.nested.nested_tensor([torch.ones(2 * n), torch.ones(2 * n)])
    dense = torch.ones(2 * n)
    out = {}
    for case, call in {
        "all_reduce": lambda: comm.all_reduce(nested, ReduceOp.SUM),
        "all_reduce_async": lambda: comm.all_reduce(nested, ReduceOp.SUM, async_op=True),
        "broadcast": lambda: comm.broadcast(nested, 0),
        "a2a_input": lambda: comm.all_to_all_single(torch.empty(2 * n), nested),
        "a2a_output": lambda: comm.all_to_all_single(nested, dense),
        "send": lambda: comm.send(nested, (comm.get_rank() + 1) % n),
    }.items():
        try:
            call()
            out[case] = "no error"
        except torchcomms.CommInputError as exc:
            out[case] = "nested" in str(exc) and "unbind" in str(exc)
    comm.all_reduce(dense, ReduceOp.SUM)
    out["usable_after"] = dense.tolist() == [float(n)] * (2 * n)
    comm.finalize()
    return out


def body_negated_views_are_refused() -> dict:
    """A negated view's memory holds the other sign: an engine would read and write it."""
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    out = {}
    for case, call in {
        "all_reduce": lambda: comm.all_reduce(torch._neg_view(torch.ones(2)), ReduceOp.MAX),
        "all_reduce_async": lambda: comm.all_reduce(
            torch._neg_view(torch.ones(2)), ReduceOp.SUM, async_op=True
        ),
        "broadcast": lambda: comm.broadcast(torch._neg_view(torch.ones(2)), 0),
        "a2a_input": lambda: comm.all_to_all_single(
            torch.empty(2 * n), torch._neg_view(torch.ones(2 * n))
        ),
        "a2a_output": lambda: comm.all_to_all_single(
            torch._neg_view(torch.zeros(2 * n)), torch.ones(2 * n)
        ),
        "all_gather_single": lambda: comm.all_gather_single(
            torch._neg_view(torch.zeros(2 * n)), torch.ones(2)
        ),
        "imag_of_conj": lambda: comm.all_reduce(
            torch.complex(torch.ones(2), torch.ones(2)).conj().imag, ReduceOp.SUM
        ),
    }.items():
        try:
            call()
            out[case] = "no error"
        except torchcomms.CommInputError as exc:
            out[case] = "resolve_neg()" in str(exc)
    # What the error suggests gives the values the view showed.
    shown = torch._neg_view(torch.full((2,), float(r + 1))).resolve_neg()
    comm.all_reduce(shown, ReduceOp.MAX)
    out["resolved"] = shown.tolist() == [-1.0, -1.0]
    comm.finalize()
    return out


def test_negated_views_are_refused_on_every_path(pool) -> None:
    for res in pool.run(body_negated_views_are_refused):
        assert res == {
            "all_reduce": True,
            "all_reduce_async": True,
            "broadcast": True,
            "a2a_input": True,
            "a2a_output": True,
            "all_gather_single": True,
            "imag_of_conj": True,
            "resolved": True,
        }


def test_nested_tensors_are_refused_on_every_path(pool) -> None:
    for res in pool.run(body_nested_tensors_are_refused):
        assert res == {
            "all_reduce": True,
            "all_reduce_async": True,
            "broadcast": True,
            "a2a_input": True,
            "a2a_output": True,
            "send": True,
            "usable_after": True,
        }


# -- a backend's own lean calls ----------------------------------------------------------------


def body_backend_lean_calls() -> dict:
    """A backend's ``lean_calls`` serve the lean lane, made for the current defaults."""
    from datetime import timedelta

    from torchcomms_gloo.backend import GlooBackend

    made: list[tuple[float, dict]] = []
    used: list[str] = []

    class Counting(GlooBackend):
        def lean_calls(self, timeout, hints):
            made.append((timeout.total_seconds(), dict(hints)))

            def all_reduce(tensor, op):
                used.append("all_reduce")
                return self.all_reduce(tensor, op, False, timeout=timeout, hints=hints)

            def broadcast(tensor, root):
                used.append("broadcast")
                return self.broadcast(tensor, root, False, timeout=timeout, hints=hints)

            def all_to_all_single(output, input):
                used.append("all_to_all_single")
                return self.all_to_all_single(output, input, False, timeout=timeout, hints=hints)

            return {
                "all_reduce": all_reduce,
                "broadcast": broadcast,
                "all_to_all_single": all_to_all_single,
            }

    torchcomms.register_backend("counting_gloo", Counting)
    try:
        comm = torchcomms.new_comm(
            "counting_gloo", torch.device("cpu"), name=unique_name("fast"), timeout=30.0
        )
        r, n = comm.get_rank(), comm.get_size()
        out: dict = {"made_at_start": list(made)}
        got = _lean_calls(comm)
        out["lean_ok"] = all(v == _expected(r, n)[op] for op, (_, v) in got.items())
        out["used_lean"] = list(used)
        used.clear()
        # Not the defaults: the methods, not the lean calls.
        t = torch.ones(2)
        comm.all_reduce(t, ReduceOp.SUM, timeout=timedelta(seconds=20))
        comm.broadcast(t, 0, hints={"k": "v"})
        comm.all_reduce(t, ReduceOp.SUM, async_op=True).wait()
        comm.all_reduce(t, ReduceOp.AVG)
        out["used_off_lane"] = list(used)
        out["off_lane_ok"] = t.tolist() == [float(n * n)] * 2
        made.clear()
        comm.set_timeout(timedelta(seconds=40))
        comm.set_hints({"tag": "x"})
        handle = comm.register_pre_hook(lambda *a: None)
        comm.all_reduce(torch.ones(1), ReduceOp.SUM)  # hooked: general path
        out["used_hooked"] = list(used)
        handle.remove()
        out["remade"] = list(made)
        got = _lean_calls(comm)
        out["lean_again_ok"] = all(v == _expected(r, n)[op] for op, (_, v) in got.items())
        out["used_again"] = list(used)
        comm.finalize()
    finally:
        torchcomms.unregister_backend("counting_gloo")
    return out


def test_a_backends_lean_calls_serve_the_lane_with_the_current_defaults(pool) -> None:
    ops = ["all_reduce", "broadcast", "all_to_all_single"]
    for res in pool.run(body_backend_lean_calls):
        assert res["made_at_start"] == [(30.0, {})]
        assert res["lean_ok"] and res["used_lean"] == ops
        assert res["used_off_lane"] == [] and res["off_lane_ok"]
        assert res["used_hooked"] == []
        # remade for the new timeout, then the hints; not while a hook was registered
        assert res["remade"] == [(40.0, {}), (40.0, {"tag": "x"}), (40.0, {"tag": "x"})]
        assert res["lean_again_ok"] and res["used_again"] == ops


def body_lane_listeners_hear_every_change() -> dict:
    from datetime import timedelta

    comm = _comm()
    heard: list[bool] = []
    handle = comm.register_lane_listener(lambda: heard.append(comm.takes_lean_calls()))
    steps = {}
    hook = comm.register_pre_hook(lambda *a: None)
    steps["hook added"] = list(heard)
    hook.remove()
    steps["hook removed"] = list(heard)
    comm.set_timeout(timedelta(seconds=77))
    steps["timeout"] = list(heard)
    comm.set_hints({"x": "1"})
    steps["hints"] = list(heard)
    handle.remove()
    comm.register_pre_hook(lambda *a: None)
    steps["after removal"] = list(heard)
    comm.finalize()
    steps["finalized"] = list(heard)
    try:
        comm.register_lane_listener(42)  # type: ignore[arg-type]
    except TypeError as exc:
        steps["refused"] = str(exc)
    return steps


def test_lane_listeners_hear_every_change_until_removed(pool2) -> None:
    for steps in pool2.run(body_lane_listeners_hear_every_change):
        assert steps["hook added"] == [False]
        assert steps["hook removed"] == [False, True]
        assert steps["timeout"] == [False, True, True]
        assert len(steps["hints"]) == 4
        assert steps["after removal"] == steps["hints"]
        assert steps["finalized"] == steps["hints"]
        assert "register_lane_listener: expected a callable" in steps["refused"]
