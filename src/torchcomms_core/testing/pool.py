"""A pool of N live rank processes that run test bodies together, each under a timeout.

Starting a rank costs seconds (importing torch), so ranks are started once and reused;
a failed, dead or hung body recycles the pool and reports every rank's traceback.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

_task_id = 0
_name_counter = itertools.count()


def _reset_names() -> None:
    # Every body starts counting afresh, so ranks agree on names even after a body in
    # which they created different numbers of communicators.
    global _name_counter
    _name_counter = itertools.count()


def unique_name(prefix: str = "comm") -> str:
    """A communicator name unique to the running body, identical on every rank."""
    return f"{prefix}-t{_task_id}-{next(_name_counter)}"


def current_rank() -> int:
    """This worker's rank (from ``TORCHCOMM_RANK``)."""
    return int(os.environ["TORCHCOMM_RANK"])


@dataclasses.dataclass
class Outcome:
    """What one rank did with a body: ``ok``, ``error``, ``died`` or ``hung``."""

    rank: int
    status: str
    value: Any = None
    error: str = ""
    exc_type: str = ""
    message: str = ""
    exitcode: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class RankFailure(AssertionError):
    """A body failed on at least one rank; the message holds every rank's story."""

    def __init__(self, fn_name: str, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        parts = [f"{fn_name} failed on {sum(not o.ok for o in outcomes)} of {len(outcomes)} ranks"]
        for o in outcomes:
            if o.ok:
                parts.append(f"--- rank {o.rank}: ok")
            elif o.status == "died":
                parts.append(f"--- rank {o.rank}: process died (exit code {o.exitcode})")
            elif o.status == "hung":
                parts.append(f"--- rank {o.rank}: did not finish in time; stacks:\n{o.error}")
            else:
                parts.append(f"--- rank {o.rank}: raised\n{o.error}")
        super().__init__("\n".join(parts))


def _worker_main(rank: int, size: int, env: dict[str, str], conn: Any, stack_file: str) -> None:
    os.environ.update(env)
    os.environ["TORCHCOMM_RANK"] = str(rank)
    os.environ["TORCHCOMM_SIZE"] = str(size)
    # Unpickling this function imported torch before ``env`` was applied, so settings torch
    # reads at import (OMP_NUM_THREADS) are applied by hand: ranks share the cores.
    threads = env.get("OMP_NUM_THREADS")
    if threads and threads.isdigit():
        import torch

        torch.set_num_threads(int(threads))
    serve(conn, stack_file)


def serve(conn: Any, stack_file: str) -> None:
    """Run the bodies the pool sends over ``conn`` until it says stop (a rank's main loop)."""
    dump = open(stack_file, "w")  # noqa: SIM115 - lives as long as the process
    if hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    import torch  # noqa: F401 - warm the imports once per worker

    import torchcomms_core  # noqa: F401

    global _task_id
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        task_id, fn, args, kwargs = msg
        _task_id = task_id
        _reset_names()
        try:
            value = fn(*args, **kwargs)
            reply: tuple[Any, ...] = ("ok", value)
        except BaseException as exc:  # report everything, including SystemExit
            reply = ("error", traceback.format_exc(), type(exc).__name__, str(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # an unpicklable result must still be reported
            conn.send(
                ("error", f"result could not be sent back: {exc!r}", type(exc).__name__, str(exc))
            )


#: Seconds a rank may take to start (import torch and the core) before it is declared hung.
STARTUP_S = 120.0

#: How a pool starts its ranks: spawned Python processes, or MPI processes under mpiexec.
LAUNCHERS = ("spawn", "mpiexec")


class RankPool:
    """N rank processes that run the same function together, like an SPMD job.

    Workers see ``TORCHCOMM_RANK``/``TORCHCOMM_SIZE`` and a rendezvous store hosted by
    this process (as torchrun's agent does), so ``torchcomms.new_comm`` works in them.
    ``rank_env`` adds variables to single ranks (``{0: {"TORCHCOMM_HOST_ID": "a"}}``),
    over ``env``, e.g. to make several simulated hosts.
    With ``launcher="mpiexec"`` the workers are MPI processes started by ``mpiexec``
    (for backends such as mpi); ``mpi_launch.mpiexec_unavailable()`` says if it can run.
    """

    def __init__(
        self,
        world_size: int,
        *,
        env: dict[str, str] | None = None,
        comm_timeout_s: float = 30.0,
        grace_s: float = 5.0,
        launcher: str = "spawn",
        rank_env: dict[int, dict[str, str]] | None = None,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"RankPool: world_size must be >= 1, got {world_size}")
        if launcher not in LAUNCHERS:
            raise ValueError(
                f"RankPool: launcher must be one of {', '.join(LAUNCHERS)}, got {launcher!r}"
            )
        self.launcher = launcher
        self.world_size = world_size
        self.grace_s = grace_s
        self._extra_env = dict(env or {})
        self._rank_env = {int(r): dict(v) for r, v in (rank_env or {}).items()}
        bad = sorted(r for r in self._rank_env if not 0 <= r < world_size)
        if bad:
            raise ValueError(f"RankPool: rank_env names rank(s) {bad}, outside 0..{world_size - 1}")
        if self._rank_env and launcher != "spawn":
            raise ValueError("RankPool: rank_env needs launcher='spawn' (mpiexec ranks share one)")
        self._comm_timeout_s = comm_timeout_s
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._stack_files: list[str] = []
        self._store: Any = None
        self._tasks = itertools.count(1)
        self.restarts = 0

    # -- lifecycle -------------------------------------------------------------------

    def _start(self) -> None:
        from torch._C._distributed_c10d import TCPStore

        self._store = TCPStore(
            "127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False
        )
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self._store.port),
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "TORCHCOMM_TIMEOUT_SECONDS": str(self._comm_timeout_s),
            # Tests provoke failures and check what survivors see; the reference default
            # (abort the process) is tested explicitly where it matters.
            "TORCHCOMM_ABORT_ON_ERROR": "0",
            "OMP_NUM_THREADS": "1",
            **self._extra_env,
        }
        ctx = multiprocessing.get_context("spawn")
        tmpdir = tempfile.mkdtemp(prefix="torchcomms-pool-")
        if self.launcher == "mpiexec":
            from torchcomms_core.testing.mpi_launch import start

            self._procs, self._conns, self._stack_files = start(self.world_size, env, tmpdir)
            return
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            stack_file = os.path.join(tmpdir, f"rank{rank}.stacks")
            proc = ctx.Process(
                target=_worker_main,
                daemon=True,
                args=(
                    rank,
                    self.world_size,
                    {**env, **self._rank_env.get(rank, {})},
                    child,
                    stack_file,
                ),
                name=f"torchcomms-rank{rank}",
            )
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)
            self._stack_files.append(stack_file)

    def close(self) -> None:
        """Stop every worker (politely, then by force)."""
        for conn in self._conns:
            try:
                conn.send(None)
            except Exception:
                pass
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        for proc in self._procs:
            proc.join(5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._stack_files = [], [], []
        self._store = None

    def __enter__(self) -> RankPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- running ---------------------------------------------------------------------

    def run(
        self, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any
    ) -> list[Any]:
        """Run ``fn(*args, **kwargs)`` on every rank; return the per-rank results.

        Raises :class:`RankFailure` (with every rank's traceback) if any rank fails.
        """
        outcomes = self.run_outcomes(fn, *args, timeout=timeout, **kwargs)
        if not all(o.ok for o in outcomes):
            raise RankFailure(getattr(fn, "__qualname__", repr(fn)), outcomes)
        return [o.value for o in outcomes]

    def run_outcomes(
        self, fn: Callable[..., Any], *args: Any, timeout: float = 60.0, **kwargs: Any
    ) -> list[Outcome]:
        """Run ``fn`` on every rank and return what happened on each, failures included."""
        if not self._procs:
            self._start()
            self.restarts += 1
            # Starting a rank (importing torch) can take longer than a short body's timeout
            # on a loaded machine: wait until every rank serves before timing ``fn``.
            started = self.run_outcomes(current_rank, timeout=max(STARTUP_S, timeout))
            if not all(o.ok for o in started):
                return started
        task = (next(self._tasks), fn, args, kwargs)
        outcomes: dict[int, Outcome] = {}
        for rank, conn in enumerate(self._conns):
            try:
                conn.send(task)
            except (BrokenPipeError, OSError):
                outcomes[rank] = Outcome(rank, "died", exitcode=self._procs[rank].exitcode)
        deadline = time.monotonic() + timeout
        waiting = {r for r in range(self.world_size) if r not in outcomes}
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            handles = {}
            for r in waiting:
                handles[self._conns[r]] = r
                sentinel = self._procs[r].sentinel
                if sentinel is not None:  # mpiexec ranks: a death closes the connection
                    handles[sentinel] = r
            ready = multiprocessing.connection.wait(list(handles), timeout=remaining)
            for h in ready:
                r = handles[h]
                if r not in waiting:
                    continue
                conn = self._conns[r]
                if h is conn or conn.poll():
                    try:
                        reply = conn.recv()
                    except (EOFError, OSError):
                        self._procs[r].join(1)
                        outcomes[r] = Outcome(r, "died", exitcode=self._procs[r].exitcode)
                    else:
                        if reply[0] == "ok":
                            outcomes[r] = Outcome(r, "ok", value=reply[1])
                        else:
                            outcomes[r] = Outcome(
                                r, "error", error=reply[1], exc_type=reply[2], message=reply[3]
                            )
                else:
                    self._procs[r].join(1)
                    outcomes[r] = Outcome(r, "died", exitcode=self._procs[r].exitcode)
                waiting.discard(r)
                if not outcomes[r].ok:
                    # Peers of a failed rank may block in a collective: give them a grace
                    # period to fail on their own, then treat them as hung.
                    deadline = min(deadline, time.monotonic() + self.grace_s)
        for r in sorted(waiting):
            outcomes[r] = Outcome(r, "hung", error=self._stacks(r))
        if any(not o.ok for o in outcomes.values()):
            self._kill()  # recycle: the next body starts on fresh ranks
        return [outcomes[r] for r in range(self.world_size)]

    def _stacks(self, rank: int) -> str:
        proc = self._procs[rank]
        if not proc.is_alive() or not hasattr(signal, "SIGUSR1"):
            return "(no stack: process not alive)"
        try:
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.5)
            with open(self._stack_files[rank]) as f:
                text = f.read()
        except OSError as exc:
            return f"(no stack: {exc})"
        return text[-6000:] or "(no stack written)"


def _self_test() -> None:  # pragma: no cover - manual smoke check
    with RankPool(2) as pool:
        print(pool.run(current_rank))


if __name__ == "__main__":  # pragma: no cover
    _self_test()
    sys.exit(0)
