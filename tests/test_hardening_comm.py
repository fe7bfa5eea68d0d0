"""One rank's mistake never poisons a communicator; abort means abort; threads are safe.

Each body runs on real gloo ranks. A refused call must leave the communicator healthy:
every test ends with a collective whose result is checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta

import pytest
import torch

import torchcomms
from torchcomms import ReduceOp
from torchcomms_core._work import is_engine_failure, is_timeout_error
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hard"), **kwargs)


def _healthy(comm) -> bool:
    """Run an all_reduce and check it: the communicator still works."""
    t = torch.ones(3)
    comm.all_reduce(t, ReduceOp.SUM)
    return bool(torch.equal(t, torch.full((3,), float(comm.get_size()))))


# -- 1. per-call timeout and hints are checked before the engine is touched ------------

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


# -- 2. tensors the result cannot be written into ---------------------------------------


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


# -- 3. only engine errors mark a communicator failed -----------------------------------


def test_classification_does_not_read_type_errors_as_timeouts() -> None:
    assert not is_timeout_error(TypeError("got an unexpected keyword argument 'timeout'"))
    assert not is_engine_failure(TypeError("got an unexpected keyword argument 'timeout'"))
    assert not is_engine_failure(ValueError("bad value"))
    assert not is_engine_failure(torchcomms.CommInputError("refused"))
    assert is_timeout_error(RuntimeError("[gloo] Timed out waiting 4000ms for recv"))
    assert is_timeout_error(TimeoutError("deadline passed"))
    assert is_engine_failure(RuntimeError("Connection closed by peer"))


def body_hook_error_leaves_comm_healthy() -> tuple[str, bool]:
    comm = _comm()

    def failing_hook(name, op_id, args) -> None:
        raise KeyError("hook bug")

    handle = comm.register_pre_hook(failing_hook)
    try:
        comm.all_reduce(torch.ones(2), ReduceOp.SUM)
        outcome = "no error"
    except KeyError:
        outcome = "hook error raised"
    handle.remove()
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


def test_a_failing_hook_does_not_poison_the_communicator(pool2) -> None:
    assert pool2.run(body_hook_error_leaves_comm_healthy) == [("hook error raised", True)] * 2


def body_backend_type_error_leaves_comm_healthy() -> tuple[str, bool]:
    from torchcomms_gloo import GlooBackend

    class Picky(GlooBackend):
        def broadcast(self, tensor, root, async_op, *, timeout=None, hints=None):
            if hints and "reject" in hints:
                raise TypeError("broadcast() got an unexpected keyword 'timeout_ms'")
            return super().broadcast(tensor, root, async_op, timeout=timeout, hints=hints)

    torchcomms.register_backend("picky_gloo", Picky)
    comm = torchcomms.new_comm("picky_gloo", torch.device("cpu"), name=unique_name("picky"))
    try:
        comm.broadcast(torch.ones(2), 0, hints={"reject": "1"})
        outcome = "no error"
    except torchcomms.CommTimeoutError:
        outcome = "misread as timeout"
    except TypeError:
        outcome = "TypeError"
    ok = _healthy(comm)
    comm.finalize()
    torchcomms.unregister_backend("picky_gloo")
    return outcome, ok


def test_a_backend_argument_error_is_not_a_timeout_and_not_fatal(pool2) -> None:
    assert pool2.run(body_backend_type_error_leaves_comm_healthy) == [("TypeError", True)] * 2


# -- 4. names ---------------------------------------------------------------------------


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


# -- 6. TORCHCOMM_CHECK_COLLECTIVES covers point to point ------------------------------


def body_p2p_mismatch_checked(kind: str) -> tuple[str, bool]:
    os.environ["TORCHCOMM_CHECK_COLLECTIVES"] = "1"
    try:
        comm = _comm()
    finally:
        del os.environ["TORCHCOMM_CHECK_COLLECTIVES"]
    r = comm.get_rank()
    try:
        if kind == "send_recv":
            if r == 0:
                comm.send(torch.ones(4), 1)
            elif r == 1:
                comm.recv(torch.zeros(8), 0)
        elif kind == "dtype":
            if r == 0:
                comm.send(torch.ones(4), 1)
            elif r == 1:
                comm.recv(torch.zeros(4, dtype=torch.float64), 0)
        else:  # a batch exchanging with both neighbours, one size wrong
            n = comm.get_size()
            batch = comm.batch_op_create()
            batch.send(torch.ones(4), (r + 1) % n)
            batch.recv(torch.zeros(4 if r != 0 else 5), (r - 1) % n)
            batch.issue(False)
        outcome = "no error"
    except torchcomms.CommInputError as exc:
        outcome = "refused" if "nothing was sent" in str(exc) and "rank" in str(exc) else str(exc)
    ok = _healthy(comm)
    comm.finalize()
    return outcome, ok


@pytest.mark.parametrize("kind", ["send_recv", "dtype", "batch"])
def test_check_collectives_turns_p2p_mismatches_into_errors_on_both_sides(pool2, kind) -> None:
    assert pool2.run(body_p2p_mismatch_checked, kind) == [("refused", True)] * 2


def body_p2p_check_passes_matching_calls() -> list[float]:
    os.environ["TORCHCOMM_CHECK_COLLECTIVES"] = "1"
    try:
        comm = _comm()
    finally:
        del os.environ["TORCHCOMM_CHECK_COLLECTIVES"]
    r, n = comm.get_rank(), comm.get_size()
    got = torch.zeros(3)
    batch = comm.batch_op_create()
    batch.send(torch.full((3,), float(r)), (r + 1) % n)
    batch.recv(got, (r - 1) % n)
    batch.issue(False)
    comm.finalize()
    return got.tolist()


def test_check_collectives_lets_matching_p2p_through(pool) -> None:
    n = pool.world_size
    assert pool.run(body_p2p_check_passes_matching_calls) == [
        [float((r - 1) % n)] * 3 for r in range(n)
    ]


# -- 7. abort means abort ---------------------------------------------------------------


def body_abort_with_op_in_flight() -> dict:
    comm = _comm(timeout=timedelta(seconds=600), abort_process_on_timeout_or_error=False)
    comm.barrier()
    out: dict = {}
    if comm.get_rank() == 0:
        work = comm.all_reduce(torch.ones(1 << 10), ReduceOp.SUM, True)  # nobody joins
        time.sleep(0.3)
        t0 = time.monotonic()
        comm.abort()
        out["abort_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        try:
            work.wait()
            out["wait"] = "completed"
        except torchcomms.CommStateError as exc:
            out["wait"] = "aborted" if "aborted" in str(exc) else str(exc)
        out["wait_s"] = time.monotonic() - t0
    else:
        # The peer sees the aborted rank's connections close: its next call fails fast.
        t0 = time.monotonic()
        try:
            comm.barrier()
            out["peer"] = "completed"
        except torchcomms.TorchCommError:
            out["peer"] = "failed"
        out["peer_s"] = time.monotonic() - t0
        comm.abort()
    return out


def test_abort_returns_at_once_and_pending_work_raises(pool2) -> None:
    rank0, rank1 = pool2.run(body_abort_with_op_in_flight, timeout=60)
    assert rank0["abort_s"] < 2.0
    assert rank0["wait"] == "aborted" and rank0["wait_s"] < 2.0
    assert rank1["peer"] == "failed" and rank1["peer_s"] < 10.0


def body_abort_from_another_thread() -> dict:
    comm = _comm(timeout=timedelta(seconds=600), abort_process_on_timeout_or_error=False)
    comm.barrier()
    out: dict = {}
    if comm.get_rank() == 0:
        timer = threading.Timer(0.5, comm.abort)
        timer.start()
        t0 = time.monotonic()
        try:
            comm.all_reduce(torch.ones(8), ReduceOp.SUM)  # blocks: the peer never joins
            out["call"] = "completed"
        except torchcomms.CommStateError as exc:
            out["call"] = "aborted" if "aborted" in str(exc) else str(exc)
        out["call_s"] = time.monotonic() - t0
        timer.join()
    else:
        try:
            comm.barrier()
        except torchcomms.TorchCommError:
            pass
        comm.abort()
    return out


def test_abort_from_a_watchdog_thread_unblocks_a_sync_call(pool2) -> None:
    rank0, _ = pool2.run(body_abort_from_another_thread, timeout=60)
    assert rank0["call"] == "aborted"
    assert rank0["call_s"] < 3.0


EXIT_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from datetime import timedelta
    import torch, torchcomms
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="exit-bounded",
                               timeout=timedelta(seconds=600),
                               abort_process_on_timeout_or_error=False)
    comm.barrier()
    if comm.get_rank() == 0:
        work = comm.all_reduce(torch.ones(16), torchcomms.ReduceOp.SUM, True)
        print("exiting", flush=True)
        sys.exit(0)  # work in flight: interpreter exit must not wait 600 s
    time.sleep(3)
    try:
        comm.barrier()
    except Exception:
        pass
""")


def test_interpreter_exit_with_work_in_flight_is_bounded(tmp_path) -> None:
    script = tmp_path / "exit_bounded.py"
    script.write_text(EXIT_SCRIPT)
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30), wait_for_workers=False)
    env_base = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHCOMM_SIZE": "2",
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            env={**env_base, "TORCHCOMM_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    t0 = time.monotonic()
    try:
        procs[0].wait(timeout=60)
        rank0_s = time.monotonic() - t0
        procs[1].wait(timeout=60)
    finally:
        for p in procs:
            p.kill()
    out0 = procs[0].stdout.read().decode()
    assert "exiting" in out0, out0
    assert procs[0].returncode == 0, out0
    assert rank0_s < 20.0  # creation + exit; the 600 s timeout is never waited out


# -- 8. threads -------------------------------------------------------------------------


def body_concurrent_finalize_and_abort(second: str) -> tuple[int, bool]:
    comm = _comm()
    comm.barrier()
    backend = comm.get_backend_impl()
    calls = {"n": 0}
    lock = threading.Lock()
    real_finalize, real_abort = backend.finalize, backend.abort

    def counted(fn):
        def inner():
            with lock:
                calls["n"] += 1
            time.sleep(0.05)  # widen the window a second caller would slip through
            fn()

        return inner

    backend.finalize, backend.abort = counted(real_finalize), counted(real_abort)
    start = threading.Barrier(2)

    def run(method: str) -> None:
        start.wait()
        getattr(comm, method)()

    threads = [
        threading.Thread(target=run, args=("finalize",)),
        threading.Thread(target=run, args=(second,)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return calls["n"], comm.is_finalized() or comm.is_aborted()


@pytest.mark.parametrize("second", ["finalize", "abort"])
def test_finalize_and_abort_from_two_threads_tear_down_once(pool2, second) -> None:
    assert pool2.run(body_concurrent_finalize_and_abort, second) == [(1, True)] * 2


def body_wait_from_two_threads() -> tuple[list[bool], list[float]]:
    comm = _comm()
    n = comm.get_size()
    base = torch.ones(6, 4)
    view = base[:, 1]  # non-contiguous: completion copies back
    work = comm.all_reduce(view, ReduceOp.SUM, True)
    results: list[bool] = []
    start = threading.Barrier(2)

    def waiter() -> None:
        start.wait()
        results.append(work.wait())
        results.append(bool(torch.equal(base[:, 1], torch.full((6,), float(n)))))

    threads = [threading.Thread(target=waiter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    comm.finalize()
    return results, base[:, 1].tolist()


def test_wait_from_two_threads_returns_the_result_to_both(pool2) -> None:
    for results, col in pool2.run(body_wait_from_two_threads):
        assert results == [True] * 4
        assert col == [2.0] * 6


def body_auto_name_from_thread() -> str:
    box: list[str] = []

    def make() -> None:
        try:
            torchcomms.new_comm("gloo", torch.device("cpu"))
            box.append("no error")
        except torchcomms.CommInputError as exc:
            box.append("refused" if "pass name=" in str(exc) else str(exc))

    t = threading.Thread(target=make)
    t.start()
    t.join()
    return box[0]


def test_generated_names_are_refused_off_the_main_thread(pool2) -> None:
    assert pool2.run(body_auto_name_from_thread) == ["refused"] * 2
