"""Strangers at the door: a job of real processes on loopback while others reach its store.

:func:`run_job` starts ``size`` rank processes that create a gloo communicator through the
rendezvous store rank 0 hosts (``MASTER_ADDR=127.0.0.1``), all-reduce a known tensor and
report what they computed, and, while they start, stranger processes:

- ``forger``: writes forged entries under the names the job's keys have without a token
  (what a stranger who knows torchcomms' key layout writes), every few milliseconds;
- ``eavesdropper``: the same under the names the keys really have with the token (what a
  stranger who watched the store's traffic could write);
- ``silent``: opens connections to the store's port and never speaks;
- ``flooder``: opens and drops connections as fast as it can, a bounded number of times,
  some with bytes that are no store request.

Used by ``tests/communicator/test_strangers.py`` and ``benchmarks/strangers.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["JobResult", "run_job", "STRANGERS"]

#: The kinds of stranger :func:`run_job` can start.
STRANGERS = ("forger", "eavesdropper", "silent", "flooder")
#: The communicator's name in the job (its store keys follow from it).
NAME = "strangers"
#: Elements of the all-reduced tensor.
NUMEL = 4096

_RANK = r"""
import json, os, sys, time
from datetime import timedelta
t0 = time.monotonic()
import torch, torchcomms
imported = time.monotonic()
out = {}
try:
    comm = torchcomms.new_comm("gloo", "cpu", name=%(name)r,
        timeout=timedelta(seconds=%(timeout)r), abort_process_on_timeout_or_error=False)
    started = time.monotonic()
    rank, size = comm.get_rank(), comm.get_size()
    t = torch.arange(%(numel)d, dtype=torch.float64) * (rank + 1)
    comm.all_reduce(t, torchcomms.ReduceOp.SUM)
    want = torch.arange(%(numel)d, dtype=torch.float64) * (size * (size + 1) // 2)
    out = {"exact": bool(torch.equal(t, want)), "start_s": started - imported}
    comm.finalize()
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc), "fail_s": time.monotonic() - imported}
print("RESULT " + json.dumps(out), flush=True)
os._exit(0)
"""

_STRANGER = r"""
import os, socket, sys, time
from datetime import timedelta
kind, port, until = sys.argv[1], int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
names = sys.argv[4].split(",") if len(sys.argv) > 4 and sys.argv[4] else []
def connect():
    while time.monotonic() < until:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=1.0)
        except OSError:
            time.sleep(0.005)
    return None
if kind in ("forger", "eavesdropper"):
    from torch._C._distributed_c10d import TCPStore
    store = None
    while store is None and time.monotonic() < until:
        if connect() is None:
            break
        try:
            store = TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5),
                             wait_for_workers=False)
        except Exception:
            time.sleep(0.01)
    n = 0
    while store is not None and time.monotonic() < until:
        for key in names:
            store.set(key, b"tcS1" + bytes(32) + b"127.0.0.1:1" + bytes([n %% 256]))
        n += 1
        time.sleep(0.002)
elif kind == "silent":
    held = []
    while time.monotonic() < until:
        if len(held) < %(silent)d:
            s = connect()
            if s is not None:
                held.append(s)
        time.sleep(0.01)
elif kind == "flooder":
    for i in range(%(flood)d):
        if time.monotonic() >= until:
            break
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=1.0)
            if i %% 3 == 0:
                s.sendall(os.urandom(64))
            s.close()
        except OSError:
            time.sleep(0.002)
"""

#: Connections the silent stranger holds open.
SILENT_CONNECTIONS = 32
#: Connection attempts of the flooder.
FLOOD_ATTEMPTS = 5000


@dataclass
class JobResult:
    """What each rank reported (``None``: it reported nothing before the limit)."""

    ranks: list[dict[str, Any] | None]
    wall_s: float
    strangers: tuple[str, ...] = ()
    stderr: list[str] = field(default_factory=list)

    @property
    def started(self) -> bool:
        """Every rank built the communicator and computed the exact sum."""
        return all(r is not None and r.get("exact") is True for r in self.ranks)

    @property
    def refused(self) -> bool:
        """Every rank failed, none computed, at least one naming an untrusted entry."""
        untrusted = [
            r
            for r in self.ranks
            if r is not None and "not written by a member" in r.get("message", "")
        ]
        return bool(untrusted) and all(r is not None and "error" in r for r in self.ranks)

    def start_s(self) -> float:
        """The slowest rank's ``new_comm`` (after importing torch)."""
        return max(float(r["start_s"]) for r in self.ranks if r is not None)

    def fail_s(self) -> float:
        """The slowest rank's time to fail."""
        return max(float(r["fail_s"]) for r in self.ranks if r is not None)


def _physical_names(token: str, size: int) -> list[str]:
    from torch._C._distributed_c10d import HashStore

    from torchcomms_core.creation.signing import SigningStore, derive_key

    signer = SigningStore(HashStore(), derive_key(token.encode(), "", 0))
    return [signer.physical(f"comm/{NAME}/0/{r}") for r in range(size)]


def run_job(
    size: int,
    *,
    token: str | None,
    strangers: tuple[str, ...] = (),
    timeout_s: float = 30.0,
    limit_s: float = 120.0,
) -> JobResult:
    """Run one job of ``size`` ranks on loopback with ``strangers`` at its store's door."""
    from torchcomms_core.bench.launch import free_port

    port = free_port()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TORCHCOMM_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHCOMM_STORE_LISTEN_ADDR="")
    if token is not None:
        env["TORCHCOMM_JOB_TOKEN"] = token
    prefix = "torchcomms/attempt_0/"
    plain = [f"{prefix}comm/{NAME}/0/{r}" for r in range(size)]
    plain += [f"{prefix}names/{NAME}/{r}" for r in range(size)]
    hidden = [prefix + n for n in _physical_names(token, size)] if token else plain
    stranger_code = _STRANGER % {"silent": SILENT_CONNECTIONS, "flood": FLOOD_ATTEMPTS}
    others: list[subprocess.Popen[bytes]] = []
    for kind in strangers:
        names = hidden if kind == "eavesdropper" else plain if kind == "forger" else []
        others.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    stranger_code,
                    kind,
                    str(port),
                    str(limit_s),
                    ",".join(names),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    code = _RANK % {"name": NAME, "timeout": timeout_s, "numel": NUMEL}
    start = time.monotonic()
    procs: list[subprocess.Popen[str]] = []
    for rank in range(size):
        renv = dict(env, RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=renv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results: list[dict[str, Any] | None] = []
    errors: list[str] = []
    try:
        for proc in procs:
            left = max(limit_s - (time.monotonic() - start), 0.1)
            try:
                out, err = proc.communicate(timeout=left)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
                results.append(None)
                errors.append(err[-2000:])
                continue
            found = [line[7:] for line in out.splitlines() if line.startswith("RESULT ")]
            results.append(json.loads(found[-1]) if found else None)
            errors.append(err[-2000:])
        wall = time.monotonic() - start
    finally:
        for group in (procs, others):
            for child in group:
                if child.poll() is None:
                    child.kill()
                child.wait()
    return JobResult(results, wall, tuple(strangers), errors)
