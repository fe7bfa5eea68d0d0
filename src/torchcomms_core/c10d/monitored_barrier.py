"""``monitored_barrier`` over a communicator, with gloo's semantics and messages.

Every rank other than 0 sends to rank 0 and waits for its answer (with the group's
timeout); rank 0 waits for each rank in turn within the barrier's timeout, names the
first one that did not arrive (or, with ``wait_all_ranks``, all of them), and answers
everyone only when all arrived, so either every rank leaves the barrier or none does.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.c10d import profiling
from torchcomms_core.comm.operations import TorchComm


def _ms(timeout: timedelta) -> int:
    return int(timeout.total_seconds() * 1000)


def _p2p(
    comm: TorchComm,
    kind: str,
    tensor: torch.Tensor,
    peer: int,
    timeout: timedelta | None,
    engine: str,
) -> Any:
    """Post a send or receive on the backend; returns ``(work, profiler record)``.

    The backend's own work, not a ``TorchWork``: a rank that misses the barrier is what
    this reports, so the communicator must stay usable, and each wait gets its own
    timeout (the time left in the barrier).
    """
    rec = profiling.begin(None, (), [(f"{engine}:{kind}", (tensor,))])
    backend = comm.get_backend_impl()
    try:
        method = backend.send if kind == "send" else backend.recv
        return method(tensor, peer, True, timeout=timeout), rec
    finally:
        if rec is not None:
            rec.issued()


def _wait(posted: tuple[Any, Any]) -> None:
    work, rec = posted
    try:
        if work is not None:
            work.wait()
    finally:
        if rec is not None:
            rec.done()


def monitored_barrier(
    comm: TorchComm, timeout: timedelta, wait_all_ranks: bool, engine: str
) -> None:
    """Run the barrier on ``comm``; raises ``RuntimeError`` naming the ranks that failed."""
    rank, size = comm.get_rank(), comm.get_size()
    token = torch.tensor([rank], device=comm.get_device())
    if rank != 0:
        # Only rank 0 enforces the barrier's timeout, so that it is the one to report;
        # the others wait with the communicator's.
        posted = [
            _p2p(comm, "send", token, 0, None, engine),
            _p2p(comm, "recv", token, 0, None, engine),
        ]
        try:
            for item in posted:
                _wait(item)
        except Exception as exc:
            raise RuntimeError(
                f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                f"while waiting for send/recv from rank 0. Please check rank 0 logs for "
                f"faulty rank.\n Original exception: \n{exc}"
            ) from exc
        return
    start = time.monotonic()
    limit = timeout.total_seconds()

    def wait_loop(kind: str, tensor: torch.Tensor) -> None:
        processed: list[int] = []
        # Waiting for every rank, all receives are posted first, each with the whole
        # timeout (gloo counts it from the wait): gloo closes every pair of a context when
        # one receive times out, so a receive posted after a late rank's would fail even
        # for a rank whose message had long arrived. Otherwise the first late rank ends
        # the barrier, and each operation is posted when its turn comes, with the time left.
        early = (
            {
                peer: _p2p(comm, kind, torch.zeros_like(tensor), peer, timeout, engine)
                for peer in range(1, size)
            }
            if wait_all_ranks and kind == "recv"
            else {}
        )
        for peer in range(1, size):
            # Waiting for every rank, each gets the whole timeout: a late rank must not
            # use up the time of the ranks after it.
            left = limit if wait_all_ranks else limit - (time.monotonic() - start)
            if not wait_all_ranks and left <= 0:
                done = (
                    f"Successfully processed ranks: {', '.join(map(str, processed))}"
                    if processed
                    else "No ranks successfully processed in monitoredBarrier."
                )
                raise RuntimeError(
                    f"Rank {rank} timed out in monitoredBarrier after {_ms(timeout)} ms.\n{done}"
                )
            try:
                posted = early.get(peer) or _p2p(
                    comm, kind, tensor, peer, timedelta(seconds=left), engine
                )
                _wait(posted)
            except Exception as exc:
                error = (
                    f"[Rank 0]: Rank {peer} failed to pass monitoredBarrier in {_ms(timeout)} ms"
                )
                if not wait_all_ranks:
                    raise RuntimeError(f"{error}\n Original exception: \n{exc}") from exc
                continue
            processed.append(peer)
        if wait_all_ranks and len(processed) != size - 1:
            failed = [r for r in range(1, size) if r not in processed]
            raise RuntimeError(
                f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass "
                f"monitoredBarrier in {_ms(timeout)} ms"
            )

    wait_loop("recv", torch.zeros_like(token))
    wait_loop("send", token)


def engine_monitored_barrier(
    engine: Any, limit: timedelta, wait_all_ranks: bool, recorded: tuple[Any, ...] | None
) -> None:
    """The engine's own barrier (gloo's protocol, timeouts and words); ``recorded``: the
    profiler is on, and these are the arguments its record shows."""
    if recorded is None:
        engine.monitored_barrier(limit, wait_all_ranks)
        return
    rec = profiling.enter("c10d::monitored_barrier_", recorded)
    try:
        engine.monitored_barrier(limit, wait_all_ranks)
    finally:
        profiling.exit(rec)


def profiled_monitored_barrier(
    comm: TorchComm,
    limit: timedelta,
    wait_all_ranks: bool,
    engine: str,
    recorded: tuple[Any, ...] | None,
) -> None:
    """:func:`monitored_barrier` with the profiler's record of the operation spanning it
    (its sends and receives record themselves)."""
    if recorded is None:
        monitored_barrier(comm, limit, wait_all_ranks, engine)
        return
    rec = profiling.begin("c10d::monitored_barrier_", recorded, (), quiet=False)
    try:
        monitored_barrier(comm, limit, wait_all_ranks, engine)
    finally:
        if rec is not None:
            rec.issued()
            rec.done()
