"""Run a function on N local ranks, one "spawn"ed process each, like a tiny torchrun.

The parent notices a rank that fails or dies and stops the others rather than wait forever.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from multiprocessing.connection import wait
from typing import Any

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import TorchCommError

#: Seconds the other ranks get to finish (and print their own errors) after one fails.
FAILURE_GRACE_S = 5.0
#: Seconds a rank gets to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 5.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (another process may still take it first)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def _environ(updates: dict[str, str | None]) -> Iterator[None]:
    """Set (or, for ``None``, remove) environment variables, restoring them afterwards."""
    saved = {key: os.environ.get(key) for key in updates}
    try:
        _set_environ(updates)
        yield
    finally:
        _set_environ(saved)


def _set_environ(updates: dict[str, str | None]) -> None:
    for key, value in updates.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def rank_environment(rank: int, nranks: int, store_file: str) -> dict[str, str | None]:
    """The variables that make a child process rank ``rank`` of a local ``nranks``-rank job.

    The ranks rendezvous through ``store_file``, a ``FileStore`` only this user can open:
    a purely local job has no reason to listen on a network port.
    """
    return {
        _env.RANK: str(rank),
        _env.SIZE: str(nranks),
        "TORCHCOMM_LOCAL_RANK": str(rank),
        # Like torchrun: how many ranks this machine runs (network namespaces emulating
        # hosts share its cores, so it counts theirs too). The gloo backend lowers its
        # event loop's priority where these ranks outnumber the cores.
        "LOCAL_WORLD_SIZE": str(nranks),
        _env.STORE_PATH: store_file,
        _env.MASTER_ADDR: None,
        _env.MASTER_PORT: None,
        # Rank 0 must not look for a surrounding launcher's store.
        _env.USE_AGENT_STORE: None,
        # Like torchrun: N ranks each using every core would oversubscribe the machine.
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS") or ("1" if nranks > 1 else None),
    }


def _child(rank: int, target: Callable[..., int], args: tuple[Any, ...]) -> None:
    try:
        code = target(*args)
    except KeyboardInterrupt:
        code = 130
    except TorchCommError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    except Exception:
        print(f"rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, end="", flush=True)
        code = 1
    sys.stdout.flush()
    sys.exit(code)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


def launch(
    nranks: int,
    target: Callable[..., int],
    args: tuple[Any, ...] = (),
    *,
    label: str = "torchcomms",
) -> int:
    """Run ``target(*args)`` on ``nranks`` spawned local ranks; return the job's exit status.

    ``target`` must be importable (a module-level function); its return value is the
    rank's exit status. The status is 0 when every rank returned 0, otherwise that of the
    first rank to fail (1 for a rank killed by a signal).
    """
    if nranks < 1:
        raise ValueError(f"need at least one rank, got {nranks}")
    ctx = multiprocessing.get_context("spawn")
    private = tempfile.mkdtemp(prefix="torchcomms-launch-")  # mode 0700
    store_file = os.path.join(private, "store")
    procs: dict[int, Any] = {}
    try:
        for rank in range(nranks):
            proc = ctx.Process(target=_child, args=(rank, target, args), name=f"rank{rank}")
            # A spawned child inherits the environment as it is at start(), before it
            # imports anything, so torchcomms reads these from the first import.
            with _environ(rank_environment(rank, nranks, store_file)):
                proc.start()
            procs[rank] = proc
        return _wait(procs, label)
    except KeyboardInterrupt:
        print(f"{label}: interrupted; stopping every rank", file=sys.stderr, flush=True)
        return 130
    finally:
        _stop([p for p in procs.values() if p.exitcode is None])
        shutil.rmtree(private, ignore_errors=True)


def _wait(procs: dict[int, Any], label: str) -> int:
    pending = {proc.sentinel: rank for rank, proc in procs.items()}
    status = 0
    failed_at: float | None = None
    while pending:
        timeout = (
            None if failed_at is None else max(0.0, failed_at + FAILURE_GRACE_S - time.monotonic())
        )
        ready = wait(list(pending), timeout=timeout)
        if not ready:
            left = sorted(pending.values())
            print(
                f"{label}: rank(s) {', '.join(map(str, left))} still running "
                f"{FAILURE_GRACE_S:g} s after a rank failed; stopping them",
                file=sys.stderr,
                flush=True,
            )
            break
        for sentinel in ready:
            rank = pending.pop(sentinel)
            proc = procs[rank]
            proc.join()
            code = proc.exitcode
            if code == 0:
                continue
            if code < 0:
                # A rank that returned normally has said why; a killed one cannot.
                print(f"{label}: rank {rank} {_describe_exit(code)}", file=sys.stderr, flush=True)
            if failed_at is None:
                failed_at = time.monotonic()
                status = code if code > 0 else 1
    return status


def _stop(procs: list[Any]) -> None:
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + TERMINATE_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.exitcode is None:
            proc.kill()
            proc.join()
