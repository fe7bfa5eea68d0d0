"""Elastic data-parallel training that survives a SIGKILL and takes a replacement back in.

    python examples/elastic_training.py                 # 4 ranks, kill one, rejoin one
    python examples/elastic_training.py --json out.json # also write the trace and timings

The script is its own launcher (the part torchrun's agent or a cluster scheduler plays):
it hosts the rendezvous store, starts ``--nproc`` workers, SIGKILLs one of them once step
``--kill-at`` is reached, and starts a replacement once the survivors have recovered.

Each worker (torchft-style):

* creates its communicator with ``enable_reconfigure=True`` and publishes a heartbeat;
* agrees on the membership through the store (:class:`Quorum`, in this file): a round
  closes once every member of the previous round has either joined it or stopped
  heartbeating; the first worker to see that writes the result with ``compare_set``;
* ``comm.reconfigure(f"round-{n}", members)``; the replicas then agree on the last
  committed step (all-reduce MAX), the lowest rank holding it broadcasts the parameters,
  and a parameter checksum is all-reduced to prove every replica is identical;
* trains: the global batch of step ``s`` is the same whatever the membership and is split
  evenly over the members, so the loss trace equals a single-process run's if no step is
  applied twice or lost (the launcher checks this against such a run);
* on a failed all-reduce (a dead member: raises within ``--timeout``) it aborts its
  communicator, which closes its connections so no peer keeps waiting, and recovers;
  when a replacement asks to join, rank 0 raises a flag carried by the step's all-reduce,
  so every member goes to the next round after the same step.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn

FEATURES, HIDDEN, GLOBAL_BATCH, LR = 8, 16, 24, 0.05


# -- model and data: identical in every process ----------------------------------------------


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (the same for every membership)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=g)
    w = torch.linspace(-1, 1, FEATURES)
    return x, (x @ w).sin().unsqueeze(1) + 0.01 * torch.randn(GLOBAL_BATCH, 1, generator=g)


def reference_losses(steps: int) -> list[float]:
    """The loss trace of one process training on the full global batches."""
    model = make_model()
    losses = []
    for s in range(steps):
        x, y = batch(s)
        loss = nn.functional.mse_loss(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()))
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p -= LR * g
        losses.append(loss.item())
    return losses


def flat_params(model: nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


# -- membership agreement through the store ---------------------------------------------------


class Quorum:
    """Rounds of membership agreement over a c10d store (keys under ``quorum/``).

    Round ``n`` closes when every member of round ``n - 1`` has joined it or its heartbeat
    is older than ``stale_s`` (round 0: when ``initial`` workers joined). Its result lists
    the previous members that joined, in their previous order, then newcomers in join order.
    """

    def __init__(self, store: Any, handle: str, stale_s: float) -> None:
        self.store, self.handle, self.stale_s = store, handle, stale_s
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.is_set():
            try:
                self.store.set(f"hb/{self.handle}", repr(time.time()))
            except Exception:  # the launcher is gone: nothing left to tell
                return
            self._stop.wait(self.stale_s / 8)

    def stop(self) -> None:
        self._stop.set()

    def _alive(self, handle: str) -> bool:
        key = f"hb/{handle}"
        if not self.store.check([key]):
            return False
        return time.time() - float(self.store.get(key)) < self.stale_s

    def result(self, n: int) -> list[str] | None:
        key = f"quorum/{n}/result"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def request_join(self, n: int) -> None:
        self.store.set(f"quorum/{n}/request", self.handle)

    def join_requested(self, n: int) -> bool:
        return self.store.check([f"quorum/{n}/request"])

    def agree(self, n: int, previous: list[str], initial: int, timeout_s: float) -> list[str]:
        s = self.store
        idx = s.add(f"quorum/{n}/count", 1)
        s.set(f"quorum/{n}/who/{idx}", self.handle)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            done = self.result(n)
            if done is not None:
                return done
            count = s.add(f"quorum/{n}/count", 0)
            joined = [s.get(f"quorum/{n}/who/{i}").decode() for i in range(1, count + 1)]
            if n == 0:
                ready = count >= initial
            else:
                ready = all(p in joined or not self._alive(p) for p in previous)
            if ready:
                members = [p for p in previous if p in joined]
                members += [h for h in joined if h not in members]
                s.compare_set(f"quorum/{n}/result", "", json.dumps(members))
                continue
            time.sleep(0.01)
        raise TimeoutError(f"quorum round {n} did not close within {timeout_s} s")


# -- the worker ---------------------------------------------------------------------------


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        from torch.distributed import TCPStore

        import torchcomms

        self.tc = torchcomms
        self.args = args
        self.store = TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        # No store: the communicator hosts its own rendezvous and its handle names it, so
        # members of a round meet at the first member's; the store above is the quorum's.
        self.comm = torchcomms.new_comm(
            "gloo",
            torch.device("cpu"),
            name="elastic",
            enable_reconfigure=True,
            timeout=timedelta(seconds=args.timeout),
        )
        self.handle = self.comm.get_init_handle()
        self.store.set(f"pid/{os.getpid()}", self.handle)
        self.quorum = Quorum(self.store, self.handle, stale_s=args.stale)
        self.model = make_model()
        self.step = -1 if args.joiner else 0  # a joiner holds no committed step
        self.round = -1
        self.members: list[str] = []
        self.trace: list[tuple[int, int, float]] = []  # (step, size, loss)
        self.recoveries: list[dict[str, Any]] = []

    def recover(self, reason: str) -> bool:
        """Agree on members, reconfigure, and bring every replica to the same state; ``False``
        when a replacement arrives after the job finished (it has nothing to join)."""
        if self.round < 0 and self.args.joiner:  # start from the latest closed round
            latest = int(self.store.get("quorum/latest"))
            self.round, self.members = latest, self.quorum.result(latest) or []
        while True:
            if self.args.joiner and self.store.check(["quorum/done"]):
                return False
            n = self.round + 1
            if n > 0 and self.handle not in self.members:
                self.quorum.request_join(n)  # rank 0 of the members raises the flag
            t_quorum = time.time()
            members = self.quorum.agree(n, self.members, self.args.nproc, timeout_s=60)
            if self.args.joiner and self.store.check(["quorum/done"]):
                return False  # the others stopped heartbeating because they finished
            self.round, self.members = n, members
            if self.handle not in members:  # too late for this round: the next one
                continue
            try:
                t_reconfigure = time.time()
                self.comm.reconfigure(f"round-{n}", members, timedelta(seconds=30))
                self._timings = {
                    "quorum_s": t_reconfigure - t_quorum,
                    "reconfigure_s": time.time() - t_reconfigure,
                }
                self._sync_state(reason)
                if self.comm.get_rank() == 0:  # its handle comes first: it hosts the rendezvous
                    self.store.set("quorum/first_pid", str(os.getpid()))
                    self.store.set("quorum/latest", str(n))
                return True
            except self.tc.TorchCommError as exc:  # someone died during recovery: again
                print(f"[{self.handle[-12:]}] recovery round {n} failed: {exc}", flush=True)
                self.comm.abort()
                reason = "failure during recovery"

    def _sync_state(self, reason: str) -> None:
        comm, rank, size = self.comm, self.comm.get_rank(), self.comm.get_size()
        step = torch.tensor([float(self.step)], dtype=torch.float64)
        comm.all_reduce(step, self.tc.ReduceOp.MAX, False)
        if rank == 0:
            self.store.set(f"recovered/{self.round}", repr(time.time()))
        best = int(step.item())
        holder = torch.tensor([float(rank if self.step == best else size)])
        comm.all_reduce(holder, self.tc.ReduceOp.MIN, False)
        src = int(holder.item())
        flat = flat_params(self.model)
        comm.broadcast(flat, src, False)
        torch.nn.utils.vector_to_parameters(flat, self.model.parameters())
        self.step = best
        total = flat_params(self.model).double().sum()
        check = torch.stack([total, -total])
        comm.all_reduce(check, self.tc.ReduceOp.MAX, False)
        identical = bool(check[0] == -check[1])
        self.recoveries.append(
            {
                "round": self.round,
                "reason": reason,
                "size": size,
                "step": best,
                "source": src,
                "checksum": float(total),
                "identical": identical,
                **self._timings,
            }
        )
        if rank == 0:
            print(
                f"round {self.round} ({reason}): {size} members, resume at step {best} "
                f"from rank {src}, checksum {float(total):.6f} identical={identical}",
                flush=True,
            )

    def train(self) -> None:
        args = self.args
        if not self.recover("grow" if args.joiner else "start"):
            self.quorum.stop()
            self.comm.finalize()
            return
        full_since: int | None = None
        while True:
            comm = self.comm
            rank, size = comm.get_rank(), comm.get_size()
            if size == args.nproc and full_since is None and self.recoveries[-1]["round"] > 0:
                full_since = self.step
            done = self.step >= args.steps and (
                args.rejoin_at < 0
                or (full_since is not None and self.step >= full_since + args.after_rejoin)
            )
            wants_join = rank == 0 and self.quorum.join_requested(self.round + 1)
            x, y = batch(self.step)
            xs, ys = x.tensor_split(size)[rank], y.tensor_split(size)[rank]
            loss = nn.functional.mse_loss(self.model(xs), ys)
            grads = torch.autograd.grad(loss, list(self.model.parameters()))
            n = float(xs.shape[0])
            flags = [1.0 if (rank == 0 and done) else 0.0, 1.0 if wants_join else 0.0]
            buf = torch.cat(
                [*(g.reshape(-1) * n for g in grads), torch.tensor([loss.item() * n, *flags])]
            )
            time.sleep(args.step_time)  # stands for the forward/backward of a real model
            try:
                comm.all_reduce(buf, self.tc.ReduceOp.SUM, False)
            except self.tc.TorchCommError as exc:
                self.store.set(f"detected/{self.handle}", repr(time.time()))
                print(
                    f"[{self.handle[-12:]}] step {self.step}: {type(exc).__name__}; recovering",
                    flush=True,
                )
                comm.abort()  # closes our connections: peers stuck on us fail now
                self.recover("failure")
                continue
            stop, join = buf[-2] > 0, buf[-1] > 0
            if stop:
                if rank == 0:
                    self.store.set("quorum/done", "1")  # replacements still starting: go home
                break
            grad = buf[:-3] / GLOBAL_BATCH
            with torch.no_grad():
                flat = flat_params(self.model) - LR * grad
                torch.nn.utils.vector_to_parameters(flat, self.model.parameters())
            self.trace.append((self.step, size, float(buf[-3]) / GLOBAL_BATCH))
            self.step += 1
            if rank == 0:
                self.store.set("progress", str(self.step))
            if join:
                self.recover("grow")  # a member is never refused: always True here
        self.quorum.stop()
        self.comm.finalize()
        checksum = float(flat_params(self.model).double().sum())
        out = {
            "handle": self.handle,
            "trace": self.trace,
            "recoveries": self.recoveries,
            "checksum": checksum,
        }
        with open(os.path.join(args.trace_dir, f"{os.getpid()}.json"), "w") as f:
            json.dump(out, f)


# -- the launcher ---------------------------------------------------------------------------


def launch(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    trace_dir = tempfile.mkdtemp(prefix="elastic-")
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port),
        "OMP_NUM_THREADS": "1",
    }
    worker_args = [sys.executable, os.path.abspath(__file__), "--worker", "--trace-dir", trace_dir]
    for k in ("nproc", "steps", "timeout", "stale", "step_time", "rejoin_at", "after_rejoin"):
        worker_args += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    procs = [subprocess.Popen(worker_args, env=env) for _ in range(args.nproc)]
    victim = procs[args.victim]
    killed_at = None
    joiner = None
    deadline = time.monotonic() + args.deadline
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within {args.deadline} s")
            progress = int(store.get("progress")) if store.check(["progress"]) else 0
            if killed_at is None and progress >= args.kill_at:
                killed_at = time.time()
                os.kill(victim.pid, signal.SIGKILL)
                kill_step = progress
            if (
                killed_at is not None
                and joiner is None
                and args.rejoin_at >= 0
                and progress >= args.rejoin_at
                and store.check(["recovered/1"])
            ):
                joiner = subprocess.Popen([*worker_args, "--joiner"], env=env)
                procs.append(joiner)
            time.sleep(0.005)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    reports = []
    for name in sorted(os.listdir(trace_dir)):
        with open(os.path.join(trace_dir, name)) as f:
            reports.append(json.load(f))
    return summarize(
        args, store, reports, codes, killed_at, kill_step if killed_at else None, victim.returncode
    )


def summarize(
    args: argparse.Namespace,
    store: Any,
    reports: list[dict[str, Any]],
    codes: list[int | None],
    killed_at: float | None,
    kill_step: int | None,
    victim_code: int | None,
) -> dict[str, Any]:
    steps: dict[int, tuple[int, float]] = {}
    disagreements = 0
    for rep in reports:
        for step, size, loss in rep["trace"]:
            if step in steps and abs(steps[step][1] - loss) > 1e-6:
                disagreements += 1
            steps.setdefault(step, (size, loss))
    last = max(steps) + 1 if steps else 0
    ref = reference_losses(last)
    trace = [
        {"step": s, "size": steps[s][0], "loss": steps[s][1], "reference": ref[s]}
        for s in sorted(steps)
    ]
    recoveries = sorted(
        {
            (r["round"], r["reason"], r["size"], r["step"], r["identical"])
            for rep in reports
            for r in rep["recoveries"]
        }
    )
    recovered = float(store.get("recovered/1")) if store.check(["recovered/1"]) else None
    detected = [
        float(store.get(f"detected/{rep['handle']}"))
        for rep in reports
        if store.check([f"detected/{rep['handle']}"])
    ]
    phases = [r for rep in reports for r in rep["recoveries"] if r["reason"] == "failure"]
    result = {
        "exit_codes": codes,
        "victim_exit": victim_code,
        "kill_step": kill_step,
        "steps": sorted(steps),
        "missing_steps": sorted(set(range(last)) - set(steps)),
        "loss_disagreements": disagreements,
        "max_loss_error": max((abs(t["loss"] - t["reference"]) for t in trace), default=None),
        "trace": trace,
        "recoveries": [
            dict(zip(("round", "reason", "size", "step", "identical"), r, strict=True))
            for r in recoveries
        ],
        "detect_s": (max(detected) - killed_at) if detected and killed_at else None,
        "recover_s": (recovered - killed_at) if recovered and killed_at else None,
        # slowest survivor: waiting for the membership, then comm.reconfigure itself
        "quorum_s": max((r["quorum_s"] for r in phases), default=None),
        "reconfigure_s": max((r["reconfigure_s"] for r in phases), default=None),
    }
    return result


def print_summary(res: dict[str, Any]) -> None:
    print(
        f"exit codes {res['exit_codes']} (victim {res['victim_exit']}), killed at step "
        f"{res['kill_step']}; {len(res['steps'])} steps, missing {res['missing_steps']}, "
        f"max |loss - single-process loss| = {res['max_loss_error']:.2e}"
    )
    for r in res["recoveries"]:
        print(
            f"  round {r['round']}: {r['reason']}, {r['size']} members, resumed at step "
            f"{r['step']}, replicas identical: {r['identical']}"
        )
    sizes = [t["size"] for t in res["trace"]]
    marks = {i for i in range(1, len(sizes)) if sizes[i] != sizes[i - 1]}
    shown = sorted({j for i in marks for j in range(i - 2, i + 3) if 0 <= j < len(sizes)})
    print("  step size loss      single-process")
    for i in shown:
        t = res["trace"][i]
        print(f"  {t['step']:4d} {t['size']:4d} {t['loss']:.6f}  {t['reference']:.6f}")
    if res["recover_s"] is not None:
        print(
            f"kill -> failure seen by the last survivor: {res['detect_s']:.3f} s; kill -> first "
            f"collective on the new membership: {res['recover_s']:.3f} s (membership "
            f"agreement {res['quorum_s']:.3f} s, reconfigure {res['reconfigure_s']:.3f} s)"
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--steps", type=int, default=30, help="train at least this many steps")
    p.add_argument("--kill-at", type=int, default=8, help="SIGKILL a worker at this step")
    p.add_argument("--victim", type=int, default=3, help="which of the workers to kill")
    p.add_argument(
        "--rejoin-at",
        type=int,
        default=12,
        help="start a replacement from this step on (-1: never)",
    )
    p.add_argument(
        "--after-rejoin",
        type=int,
        default=5,
        help="steps to train with the full membership again before stopping",
    )
    p.add_argument("--timeout", type=float, default=2.0, help="communicator timeout, s")
    p.add_argument("--stale", type=float, default=1.0, help="heartbeat age that means dead, s")
    p.add_argument("--step-time", type=float, default=0.02, help="simulated compute, s")
    p.add_argument("--deadline", type=float, default=120.0)
    p.add_argument("--json", help="write the trace and timings here")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--joiner", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trace-dir", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        Worker(args).train()
        return
    res = launch(args)
    print_summary(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    ok = (
        not res["missing_steps"]
        and res["loss_disagreements"] == 0
        and res["max_loss_error"] is not None
        and res["max_loss_error"] < 1e-4
        and all(r["identical"] for r in res["recoveries"])
        and all(c == 0 for i, c in enumerate(res["exit_codes"]) if i != args.victim)
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
