"""Chaos: 4 ranks train 200 steps while one random rank is SIGKILLed every 20 steps.

Two stacks, each over ``torchcomms.new_comm("gloo", "cpu", enable_reconfigure=True)`` with
self-hosted handles (no shared store for the communicators):

* ``torchft``: torchft's lighthouse and Manager, 4 replica groups of one process each
  (``examples/torchft_training.py``); failure detection is the lighthouse heartbeat timeout.
* ``elastic``: the store quorum of ``examples/elastic_training.py`` (heartbeats in a
  launcher store); failure detection is its ``--stale`` heartbeat age.

Every other kill takes the member whose handle comes first (the one hosting the rendezvous
the others meet in), the rest a random member; a replacement starts at once and the next
kill waits until it is back in. Printed per stack: kill -> next committed step (p50, p99,
max), hangs (a kill with no committed step within ``--hang-after``: none allowed, every
wait has a timeout), the final loss against a fault-free run of the same data, and whether
the survivors' parameters agree.

    python benchmarks/chaos.py                      # both stacks, 10 kills each
    python benchmarks/chaos.py --stack torchft --kills 4
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCHFT = os.path.join(ROOT, "examples", "torchft_training.py")
ELASTIC = os.path.join(ROOT, "examples", "elastic_training.py")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def run_torchft(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ft.json")
        cmd = [
            sys.executable, TORCHFT, "--replicas", str(args.ranks), "--steps", str(args.steps),
            "--kills", str(args.kills), "--kill-every", str(args.kill_every),
            "--step-time", str(args.step_time), "--heartbeat-timeout", str(args.detect),
            "--timeout", str(args.timeout), "--hang-after", str(args.hang_after),
            "--seed", str(args.seed), "--quiet", "--json", out,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.deadline)
        if proc.returncode != 0:
            hangs = 1 if "no step committed within" in proc.stderr else 0
            return {"error": proc.stderr[-3000:], "hangs": hangs}
        with open(out) as f:
            res = json.load(f)
    return {
        "recover_s": [k["recover_s"] for k in res["kills"]],
        "first_handle_kills": sum(k["first_handle"] for k in res["kills"]),
        "hangs": res["hangs"],
        "final_loss": res["final_loss"],
        "reference_loss": res["reference_loss"],
        "survivors_equal": res["max_param_spread"] < 1e-6,
        "finished": res["finished"],
        "detect_s": args.detect,
    }


def run_elastic(args: argparse.Namespace) -> dict[str, Any]:
    """Drive ``elastic_training.py``'s workers with a kill schedule of this benchmark."""
    from torch.distributed import TCPStore

    sys.path.insert(0, os.path.dirname(ELASTIC))
    import elastic_training

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    trace_dir = tempfile.mkdtemp(prefix="chaos-")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [
        sys.executable, ELASTIC, "--worker", "--trace-dir", trace_dir, "--nproc", str(args.ranks),
        "--steps", str(args.steps), "--timeout", str(args.timeout), "--stale", str(args.detect),
        "--step-time", str(args.step_time), "--rejoin-at", "-1", "--after-rejoin", "0",
    ]  # fmt: skip
    out = subprocess.DEVNULL
    procs = [subprocess.Popen(cmd, env=env, stdout=out, stderr=out) for _ in range(args.ranks)]
    rng = random.Random(args.seed)
    kills: list[dict[str, Any]] = []
    hangs = 0
    deadline = time.monotonic() + args.deadline

    def progress() -> int:
        return int(store.get("progress")) if store.check(["progress"]) else 0

    def members() -> int:
        if not store.check(["quorum/latest"]):
            return 0
        latest = int(store.get("quorum/latest"))
        return len(json.loads(store.get(f"quorum/{latest}/result")))

    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the elastic job did not finish within {args.deadline} s")
            step = progress()
            due = args.kill_every * len(kills) + args.kill_every // 2
            if len(kills) < args.kills and step >= due and members() == args.ranks:
                live = [p for p in procs if p.poll() is None]
                first_pid = int(store.get("quorum/first_pid"))
                first = next((p for p in live if p.pid == first_pid), None)
                victim = first if len(kills) % 2 == 0 and first is not None else rng.choice(live)
                step = progress()
                t_kill = time.time()
                os.kill(victim.pid, signal.SIGKILL)
                victim.wait()
                procs.append(subprocess.Popen([*cmd, "--joiner"], env=env, stdout=out, stderr=out))
                while progress() <= step:
                    if time.time() - t_kill > args.hang_after:
                        hangs += 1
                        raise TimeoutError(f"no step committed within {args.hang_after} s")
                    time.sleep(0.002)
                kills.append({"recover_s": time.time() - t_kill, "first_handle": victim is first})
            time.sleep(0.005)
    except TimeoutError as exc:
        return {"error": str(exc), "hangs": hangs}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    codes = [p.returncode for p in procs]
    if any(c not in (0, -signal.SIGKILL) for c in codes):
        return {"error": f"worker exit codes {codes}", "hangs": hangs}
    reports = []
    for name in sorted(os.listdir(trace_dir)):
        with open(os.path.join(trace_dir, name)) as f:
            reports.append(json.load(f))
        os.unlink(os.path.join(trace_dir, name))
    os.rmdir(trace_dir)
    last = max(step for rep in reports for step, _size, _loss in rep["trace"])
    final = [loss for rep in reports for step, _size, loss in rep["trace"] if step == last]
    checksums = {round(rep["checksum"], 9) for rep in reports}
    return {
        "recover_s": [k["recover_s"] for k in kills],
        "first_handle_kills": sum(k["first_handle"] for k in kills),
        "hangs": hangs,
        "final_loss": final[0],
        "reference_loss": elastic_training.reference_losses(last + 1)[last],
        "survivors_equal": len(checksums) == 1,
        "finished": len(reports),
        "detect_s": args.detect,
    }


def report(stack: str, res: dict[str, Any]) -> None:
    if "error" in res:
        print(f"| {stack} | failed: {res['error'][-300:]!r} | hangs {res['hangs']} |")
        return
    rec = res["recover_s"]
    print(
        f"| {stack} | {len(rec)} ({res['first_handle_kills']} first-handle) | "
        f"{res['detect_s']} | {statistics.median(rec):.3f} | {_percentile(rec, 0.99):.3f} | "
        f"{max(rec):.3f} | {res['hangs']} | {res['final_loss']:.6f} | "
        f"{res['reference_loss']:.6f} | {res['survivors_equal']} ({res['finished']}) |",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--stack", choices=("torchft", "elastic", "both"), default="both")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--kill-every", type=int, default=20)
    p.add_argument(
        "--step-time",
        type=float,
        default=0.25,
        help="simulated compute, s: 20 steps leave a replacement time to start and rejoin",
    )
    p.add_argument(
        "--detect", type=float, default=1.0, help="failure detection: heartbeat timeout, s"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="communicator timeout, s")
    p.add_argument("--hang-after", type=float, default=60.0)
    p.add_argument("--deadline", type=float, default=1200.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(
        "| stack | kills | detection (s) | kill -> next committed step p50 (s) | p99 (s) | "
        "max (s) | hangs | final loss | fault-free loss | survivors equal (finished) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|", flush=True)
    if args.stack in ("torchft", "both"):
        report("torchft Manager", run_torchft(args))
    if args.stack in ("elastic", "both"):
        report("elastic_training quorum", run_elastic(args))


if __name__ == "__main__":
    main()
