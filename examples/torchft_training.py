"""Fault-tolerant DDP with torchft over torchcomms: replica groups as separate processes.

    pip install torchft-nightly                          # torchft's Manager and lighthouse
    python examples/torchft_training.py                  # 2 replica groups, one SIGKILLed
    python examples/torchft_training.py --replicas 4 --kills 3 --json out.json

The script is its own launcher: it runs torchft's lighthouse, starts ``--replicas``
replica groups (one process each) and SIGKILLs one of them every ``--kill-every`` steps,
starting a replacement at once. Each replica group trains with torchft's ``Manager``,
``DistributedDataParallel`` and ``Optimizer`` over ``ProcessGroupTorchComms``, a torchft
process group on ``torchcomms.new_comm("gloo", "cpu", enable_reconfigure=True)``; the
communicator needs no store and no launcher: its handle names the rendezvous it hosts.

On every new quorum the Manager calls ``comm.reconfigure(quorum_id, handles)``; a
replacement heals from a live replica (torchft's checkpoint transport) and joins. The global
batch of step ``s`` is the same for every membership and split evenly over the participants,
so the final loss equals a fault-free run's; the launcher checks that, and that every
replica that finished holds the same parameters.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn

FEATURES, HIDDEN, GLOBAL_BATCH, LR = 8, 16, 24, 0.05


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, 1))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step`` (the same for every membership)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, FEATURES, generator=g)
    w = torch.linspace(-1, 1, FEATURES)
    return x, (x @ w).sin().unsqueeze(1) + 0.01 * torch.randn(GLOBAL_BATCH, 1, generator=g)


def full_loss(model: nn.Module, step: int) -> float:
    with torch.no_grad():
        x, y = batch(step)
        return float(nn.functional.mse_loss(model(x), y))


def reference(steps: int) -> tuple[float, list[float]]:
    """The fault-free run: final loss and parameters, single process, same data."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(steps):
        x, y = batch(step)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    flat = torch.nn.utils.parameters_to_vector(model.parameters())
    return full_loss(model, steps), flat.tolist()


# -- one replica group (a process) ------------------------------------------------------------


def worker(args: argparse.Namespace) -> None:
    from torch.distributed import TCPStore
    from torchft import DistributedDataParallel, Manager, Optimizer
    from torchft.torchcomms import ProcessGroupTorchComms

    import torchcomms

    control = TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False
    )  # the launcher's, for progress reports only; torchcomms never sees it
    group_store = TCPStore("localhost", 0, None, True, wait_for_workers=False)  # the Manager's
    timeout = timedelta(seconds=args.timeout)
    comm = torchcomms.new_comm(
        "gloo", torch.device("cpu"), name="ft0", enable_reconfigure=True, timeout=timeout
    )
    pg = ProcessGroupTorchComms(comm=comm, timeout=timeout)
    model = make_model()
    inner = torch.optim.SGD(model.parameters(), lr=LR)

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optim": inner.state_dict()}

    def load_state_dict(sd: dict[str, Any]) -> None:
        model.load_state_dict(sd["model"])
        inner.load_state_dict(sd["optim"])

    manager = Manager(
        pg=pg,
        min_replica_size=1,
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        replica_id=f"replica_{args.slot}",
        store_addr="localhost",
        store_port=group_store.port,
        rank=0,
        world_size=1,
        lighthouse_addr=args.lighthouse,
        use_async_quorum=False,
        timeout=timeout,
        quorum_timeout=timedelta(seconds=args.deadline),
        connect_timeout=timedelta(seconds=30),
    )
    ddp = DistributedDataParallel(manager, model)
    opt = Optimizer(manager, inner)
    me = f"{args.slot}/{os.getpid()}"
    control.set(f"handle/{me}", comm.get_init_handle())
    if args.barrier:  # the first replica groups start together, as a scheduler would
        control.add("ready", 1)
        while int(control.add("ready", 0)) < args.barrier:
            time.sleep(0.01)
    while manager.current_step() < args.steps:
        opt.zero_grad()  # the quorum: reconfigure and heal when membership changed
        if control.check(["done"]):  # a replacement that came after the others finished
            manager.shutdown(wait=False)
            os._exit(0)
        step = manager.current_step()
        rank = manager.participating_rank()
        n = max(manager.num_participants(), 1)
        x, y = batch(step)
        part = rank if rank is not None else 0
        loss = nn.functional.mse_loss(ddp(x.tensor_split(n)[part]), y.tensor_split(n)[part])
        loss.backward()
        time.sleep(args.step_time)  # stands for the forward/backward of a real model
        opt.step()  # should_commit: steps the optimizer only if every participant agreed
        if manager.current_step() > step:
            control.set(
                f"progress/{me}",
                json.dumps({"step": manager.current_step(), "rank": comm.get_rank(), "n": n}),
            )
    flat = torch.nn.utils.parameters_to_vector(model.parameters())
    result = {"loss": full_loss(model, args.steps), "params": flat.tolist()}
    control.set(f"result/{me}", json.dumps(result))
    control.set("done", "1")
    manager.shutdown(wait=False)
    comm.finalize()
    os._exit(0)  # torchft's background threads need not be joined


# -- the launcher ---------------------------------------------------------------------------


class Job:
    """Replica-group processes, their reports and the kills."""

    def __init__(self, args: argparse.Namespace) -> None:
        from torch.distributed import TCPStore
        from torchft._torchft import LighthouseServer

        self.args = args
        self.lighthouse = LighthouseServer(
            bind="[::]:0",
            min_replicas=1,
            join_timeout_ms=int(args.join_timeout * 1000),
            heartbeat_timeout_ms=int(args.heartbeat_timeout * 1000),
        )
        self.store = TCPStore(
            "127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False
        )
        self.env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.store.port),
            "OMP_NUM_THREADS": "1",
        }
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.exited: list[tuple[int, int, int]] = []  # (slot, pid, code)

    def start(self, slot: int, barrier: int = 0) -> None:
        a = self.args
        cmd = [
            sys.executable, os.path.abspath(__file__), "--worker", "--slot", str(slot),
            "--lighthouse", self.lighthouse.address(), "--steps", str(a.steps),
            "--timeout", str(a.timeout), "--step-time", str(a.step_time),
            "--deadline", str(a.deadline), "--barrier", str(barrier),
        ]  # fmt: skip
        self.procs[slot] = subprocess.Popen(
            cmd, env=self.env, stdout=subprocess.DEVNULL if a.quiet else None,
            stderr=subprocess.DEVNULL if a.quiet else None,
        )  # fmt: skip

    def reports(self) -> dict[str, dict[str, Any]]:
        out = {}
        for slot, p in self.procs.items():
            key = f"progress/{slot}/{p.pid}"
            if self.store.check([key]):
                out[f"{slot}/{p.pid}"] = json.loads(self.store.get(key))
        return out

    def progress(self) -> tuple[int, int]:
        """(highest committed step of a live replica, participants of that step)."""
        best = (0, 0)
        for rep in self.reports().values():
            best = max(best, (int(rep["step"]), int(rep["n"])))
        return best

    def first_handle_slot(self) -> int | None:
        """The slot whose handle came first in the last quorum (participating rank 0)."""
        firsts = [(rep["step"], me) for me, rep in self.reports().items() if rep["rank"] == 0]
        return int(max(firsts)[1].split("/")[0]) if firsts else None

    def reap(self) -> None:
        for slot, p in list(self.procs.items()):
            code = p.poll()
            if code is not None and code != 0 and code != -signal.SIGKILL:
                raise RuntimeError(f"replica group {slot} (pid {p.pid}) failed with exit {code}")

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
        self.lighthouse.shutdown()


def launch(args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    job = Job(args)
    kills: list[dict[str, Any]] = []
    hangs = 0
    deadline = time.monotonic() + args.deadline
    try:
        for slot in range(args.replicas):
            job.start(slot, barrier=args.replicas)
        while True:
            job.reap()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the job did not finish within {args.deadline} s")
            step, n = job.progress()
            if kills and "rejoin_s" not in kills[-1] and n == args.replicas:
                kills[-1]["rejoin_s"] = time.time() - kills[-1].pop("t_kill")
            live = [s for s, p in job.procs.items() if p.poll() is None]
            if not live and step >= args.steps:
                break
            due = args.kill_every * len(kills) + args.kill_every // 2
            if len(kills) < args.kills and step >= due and n == args.replicas:
                first = job.first_handle_slot()
                # Every other kill takes the member whose handle comes first: the one
                # hosting the rendezvous the others meet in.
                victim = first if len(kills) % 2 == 0 and first is not None else rng.choice(live)
                pid = job.procs[victim].pid
                t_kill = time.time()
                os.kill(pid, signal.SIGKILL)
                job.procs[victim].wait()
                job.start(victim)  # the replacement starts at once
                kill = {"step": step, "slot": victim, "first_handle": victim == first}
                recovered = None
                while recovered is None:
                    job.reap()
                    now_step, _ = job.progress()
                    if now_step > step:
                        recovered = time.time()
                    elif time.time() - t_kill > args.hang_after:
                        hangs += 1
                        raise TimeoutError(
                            f"no step committed within {args.hang_after} s of kill {len(kills)}"
                        )
                    else:
                        time.sleep(0.002)
                kill["recover_s"] = recovered - t_kill
                kill["t_kill"] = t_kill  # until the replacement is in (rejoin_s)
                kills.append(kill)
                if not args.quiet:
                    print(f"kill {len(kills)}: {kill}", flush=True)
            time.sleep(0.005)
        for k in kills:
            k.pop("t_kill", None)  # a replacement that never got in has no rejoin_s
        results = [
            json.loads(job.store.get(k))
            for k in (f"result/{s}/{p.pid}" for s, p in job.procs.items())
            if job.store.check([k])
        ]
    finally:
        job.close()
    ref_loss, ref_params = reference(args.steps)
    params = [r["params"] for r in results]
    spread = max(
        (abs(a - b) for ps in params for a, b in zip(ps, params[0], strict=True)), default=0.0
    )
    ref_error = max(
        (abs(a - b) for ps in params for a, b in zip(ps, ref_params, strict=True)), default=0.0
    )
    return {
        "replicas": args.replicas,
        "steps": args.steps,
        "kills": kills,
        "hangs": hangs,
        "finished": len(results),
        "final_loss": results[0]["loss"] if results else None,
        "reference_loss": ref_loss,
        "max_param_spread": spread,
        "max_param_error_vs_reference": ref_error,
        "heartbeat_timeout_s": args.heartbeat_timeout,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--kills", type=int, default=1)
    p.add_argument("--kill-every", type=int, default=20, help="steps between kills")
    p.add_argument("--timeout", type=float, default=5.0, help="communicator timeout, s")
    p.add_argument("--heartbeat-timeout", type=float, default=1.0, help="lighthouse, s")
    p.add_argument("--join-timeout", type=float, default=0.5, help="lighthouse, s")
    p.add_argument("--step-time", type=float, default=0.02, help="simulated compute, s")
    p.add_argument("--hang-after", type=float, default=60.0, help="a kill with no commit")
    p.add_argument("--deadline", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--quiet", action="store_true", help="drop the workers' output")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--slot", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--lighthouse", help=argparse.SUPPRESS)
    p.add_argument("--barrier", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    res = launch(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f)
    print(json.dumps({k: v for k, v in res.items() if k != "kills"}))
    for k in res["kills"]:
        back = f"{k['rejoin_s']:.3f} s" if "rejoin_s" in k else "never"
        print(f"  kill at step {k['step']}: slot {k['slot']} first_handle={k['first_handle']} "
              f"-> next committed step {k['recover_s']:.3f} s, replacement in: {back}")  # fmt: skip


if __name__ == "__main__":
    main()
