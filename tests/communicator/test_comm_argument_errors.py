"""Bad arguments are refused before the engine is touched, and the communicator stays usable.

Per-call timeouts and hints, result tensors that cannot be written into, and communicator
names. Each body runs on real gloo ranks and ends with a collective whose result is checked.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hard"), **kwargs)


def _healthy(comm) -> bool:
    """Run an all_reduce and check it: the communicator still works."""
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    return bool(torch.equal(t, torch.full((3,), float(comm.get_size()))))


# -- per-call timeout and hints are checked before the engine is touched ------------

BAD_TIMEOUTS = {
    "negative_seconds": (-1, torchcomms.CommInputError, "must be positive"),
    "zero_seconds": (0, torchcomms.CommInputError, "must be positive"),
    "zero_timedelta": (timedelta(0), torchcomms.CommInputError, "must be positive"),
    "timedelta_max": (timedelta.max, torchcomms.CommInputError, "longest supported"),
    "inf": (float("inf"), torchcomms.CommInputError, "finite"),
    "nan": (float("nan"), torchcomms.CommInputError, "finite"),
    "huge_seconds": (1e300, torchcomms.CommInputError, "longest supported"),
    "string": ("5", torchcomms.CommTypeError, "timedelta or a number of seconds"),
    "bool": (True, torchcomms.CommTypeError, "timedelta or a number of seconds"),
}


def body_bad_timeout(case: str, abort_on_error: bool) -> tuple[str, bool]:
    value, error, words = BAD_TIMEOUTS[case]
    comm = _comm(abort_process_on_timeout_or_error=abort_on_error)
    t = torch.ones(4)
    try:
        comm.all_reduce(t, ReduceOp.SUM, False, None, value)
        outcome = "no error"
    except error as exc:
        outcome = "refused" if words in str(exc) else f"wrong message: {exc}"
    unchanged = bool(torch.equal(t, torch.ones(4)))
    ok = unchanged and _healthy(comm)
    comm.finalize()
    return outcome, ok


@pytest.mark.parametrize("case", sorted(BAD_TIMEOUTS))
def test_bad_per_call_timeout_is_refused_and_the_comm_stays_usable(pool2, case) -> None:
    assert pool2.run(body_bad_timeout, case, True) == [("refused", True)] * 2


def body_number_timeout_is_seconds() -> tuple[float, bool]:
    comm = _comm()
    t = torch.full((2,), float(comm.get_rank()))
    comm.all_reduce(t, ReduceOp.SUM, timeout=5)
    work = comm.barrier(True, None, 2.5)
    work.wait()
    ok = _healthy(comm)
    comm.finalize()
    return float(t[0]), ok


def test_int_and_float_timeouts_are_seconds(pool) -> None:
    n = pool.world_size
    assert pool.run(body_number_timeout_is_seconds) == [(float(sum(range(n))), True)] * n


def body_bad_hints() -> tuple[str, bool]:
    comm = _comm()
    try:
        comm.broadcast(torch.ones(2), 0, False, {"algo": 1})
        outcome = "no error"
    except torchcomms.CommTypeError as exc:
        outcome = "refused" if "dict[str, str]" in str(exc) else str(exc)
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


def test_bad_hints_are_refused_and_the_comm_stays_usable(pool2) -> None:
    assert pool2.run(body_bad_hints) == [("refused", True)] * 2


def test_timeout_env_variable_out_of_range_names_the_variable(monkeypatch) -> None:
    for raw in ("inf", "nan", "1e300", "-3"):
        monkeypatch.setenv("TORCHCOMM_TIMEOUT_SECONDS", raw)
        with pytest.raises(torchcomms.CommInputError, match="TORCHCOMM_TIMEOUT_SECONDS"):
            torchcomms.new_comm("gloo", torch.device("cpu"), name="env-timeout")


# -- tensors the result cannot be written into ---------------------------------------


def body_overlapping_result_tensor(abort_on_error: bool) -> tuple[list[str], bool]:
    comm = _comm(abort_process_on_timeout_or_error=abort_on_error)
    peer = 1 - comm.get_rank() if comm.get_size() == 2 else None
    calls = {
        "all_reduce": lambda: comm.all_reduce(torch.ones(1).expand(3), ReduceOp.SUM),
        "broadcast": lambda: comm.broadcast(torch.zeros(2, 1).expand(2, 4), 0),
        "all_gather_single": lambda: comm.all_gather_single(
            torch.zeros(1).expand(2 * comm.get_size()), torch.ones(2)
        ),
    }
    messages = []
    for name, call in calls.items():
        try:
            call()
            messages.append(f"{name}: no error")
        except torchcomms.CommInputError as exc:
            messages.append("refused" if "share memory" in str(exc) else str(exc))
    if peer is not None:  # receiving into a broadcast view
        try:
            comm.recv(torch.zeros(1).expand(4), peer)
            messages.append("recv: no error")
        except torchcomms.CommInputError as exc:
            messages.append("refused" if "share memory" in str(exc) else str(exc))
    ok = _healthy(comm)
    comm.finalize()
    return messages, ok


def test_overlapping_result_tensors_are_refused_up_front(pool2) -> None:
    for messages, ok in pool2.run(body_overlapping_result_tensor, True):
        assert messages == ["refused"] * 4
        assert ok


def body_non_contiguous_views() -> tuple[list[float], str, list[float]]:
    comm = _comm()
    r = comm.get_rank()
    base = torch.zeros(4, 6)
    col = base[:, ::2]  # non-contiguous, no overlap: keeps working
    col.fill_(r + 1)
    comm.all_reduce(col, ReduceOp.SUM)
    w = torch.ones(4, 4, requires_grad=True)
    try:
        comm.all_reduce(w[:, 0], ReduceOp.SUM)
        grad_msg = "no error"
    except torchcomms.CommInputError as exc:
        grad_msg = "refused" if "requires grad" in str(exc) else str(exc)
    with torch.no_grad():
        comm.all_reduce(w[:, 0], ReduceOp.SUM)
    comm.finalize()
    return base[:, 0].tolist(), grad_msg, w.detach()[:, 0].tolist()


def test_non_overlapping_views_work_and_grad_leaf_views_are_refused(pool) -> None:
    n = pool.world_size
    total = float(sum(range(1, n + 1)))
    for col, grad_msg, w in pool.run(body_non_contiguous_views):
        assert col == [total] * 4
        assert grad_msg == "refused"
        assert w == [float(n)] * 4


def body_gather_through_transposed_output() -> list[list[float]]:
    comm = _comm()
    r, n = comm.get_rank(), comm.get_size()
    out = torch.zeros(4, n)
    comm.all_gather_single(out.t(), torch.full((4,), float(r)))  # (n, 4) non-contiguous view
    comm.finalize()
    return out.t().tolist()


def test_transposed_output_view_receives_every_rank(pool) -> None:
    n = pool.world_size
    expected = [[float(r)] * 4 for r in range(n)]
    assert pool.run(body_gather_through_transposed_output) == [expected] * n


# -- names ---------------------------------------------------------------------------


def body_split_name_with_slash() -> tuple[str, bool]:
    comm = _comm()
    try:
        comm.split(list(range(comm.get_size())), "a/b")
        outcome = "no error"
    except torchcomms.CommInputError as exc:
        outcome = "refused" if "without '/'" in str(exc) else str(exc)
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


def test_split_refuses_names_with_a_slash(pool2) -> None:
    assert pool2.run(body_split_name_with_slash) == [("refused", True)] * 2


def body_name_released_after_failed_creation() -> tuple[str, bool]:
    from torchcomms_gloo import GlooBackend

    attempts = {"n": 0}

    class FlakyInit(GlooBackend):
        def init(self, device, name, options):
            attempts["n"] += 1
            if attempts["n"] == 1:
                raise RuntimeError("simulated engine start failure")
            super().init(device, name, options)

    torchcomms.register_backend("flaky_gloo", FlakyInit)
    name = unique_name("retry")
    try:
        torchcomms.new_comm("flaky_gloo", torch.device("cpu"), name=name)
        first = "no error"
    except torchcomms.CommOperationError as exc:
        first = "failed" if "simulated engine start failure" in str(exc) else str(exc)
    comm = torchcomms.new_comm("flaky_gloo", torch.device("cpu"), name=name)
    ok = _healthy(comm)
    comm.finalize()
    torchcomms.unregister_backend("flaky_gloo")
    return first, ok


def test_a_name_is_released_when_creation_fails(pool2) -> None:
    assert pool2.run(body_name_released_after_failed_creation) == [("failed", True)] * 2
