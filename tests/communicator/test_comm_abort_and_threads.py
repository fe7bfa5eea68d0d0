"""Abort means abort, and threads are safe: abort returns at once and unblocks calls in
flight, finalize and abort from two threads tear down once, and work waited on from two
threads returns to both. Each body runs on real gloo ranks.
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
from torchcomms_core.testing import unique_name


def _comm(**kwargs):
    return torchcomms.new_comm("gloo", torch.device("cpu"), name=unique_name("hard"), **kwargs)


# -- abort means abort ---------------------------------------------------------------


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


# -- threads -------------------------------------------------------------------------


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
