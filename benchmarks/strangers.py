"""Start time of a job with a job token, with and without strangers at its store's door.

Each run is a fresh job of real processes on loopback (``torchcomms_core.testing.strangers``):
``--nproc`` ranks create a gloo communicator through the store rank 0 hosts and all-reduce a
known tensor. The figure per run is the slowest rank's ``new_comm`` (after importing torch).
Prints, as medians of ``--runs``:

- the bootstrap time without a token and with one (the cost of signing);
- the start time with a token while a forger, a silent connection holder and a flooder
  work at the store (the job must start and compute the exact sum);
- the time to fail when a stranger writes forged entries under the keys' real names: the
  first rank's ``CommStateError`` and the slowest rank's failure.

    python benchmarks/strangers.py                 # 4 ranks, 10 runs
    python benchmarks/strangers.py --nproc 4 --runs 10 --fail-runs 3 --json strangers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from torchcomms_core.testing.strangers import run_job

TOKEN = "benchmark-job-token-0123456789abcdef"


def _median_start(nproc: int, runs: int, token: str | None, strangers: tuple[str, ...]) -> float:
    times = []
    for _ in range(runs):
        result = run_job(nproc, token=token, strangers=strangers, timeout_s=60)
        if not result.started:
            sys.exit(f"a run did not start and compute the exact sum: {result.ranks}")
        times.append(result.start_s())
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--fail-runs", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=10.0, help="the communicator's, s")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    figures: dict[str, float] = {}
    order = [("no token", None, ()), ("token", TOKEN, ())]
    order.append(("token, strangers", TOKEN, ("forger", "silent", "flooder")))
    for label, token, strangers in order:
        figures[label] = _median_start(args.nproc, args.runs, token, strangers)
        print(f"start, {label:<18} median of {args.runs}: {figures[label] * 1e3:8.1f} ms")
    first, slowest, kinds = [], [], set()
    for _ in range(args.fail_runs):
        result = run_job(
            args.nproc, token=TOKEN, strangers=("eavesdropper",), timeout_s=args.timeout
        )
        if any(r is not None and r.get("exact") for r in result.ranks) or None in result.ranks:
            sys.exit(f"a rank computed with forged entries or never ended: {result.ranks}")
        failed = [r for r in result.ranks if r is not None]
        refused = [r["fail_s"] for r in failed if "not written by a member" in r["message"]]
        if not refused:
            sys.exit(f"no rank named the forged entry: {result.ranks}")
        first.append(min(refused))
        slowest.append(result.fail_s())
        kinds.update(r["error"] for r in failed)
    figures["fail, first rank"] = statistics.median(first)
    figures["fail, every rank"] = statistics.median(slowest)
    print(
        f"fail, forged entry, first rank (CommStateError) median of {args.fail_runs}: "
        f"{figures['fail, first rank'] * 1e3:8.1f} ms"
    )
    print(
        f"fail, forged entry, every rank ended           median of {args.fail_runs}: "
        f"{figures['fail, every rank'] * 1e3:8.1f} ms (errors: {', '.join(sorted(kinds))}; "
        f"communicator timeout {args.timeout:g} s)"
    )
    ratio = figures["token"] / figures["no token"]
    print(f"signing costs: {ratio:.2f}x the bootstrap time without a token")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"nproc": args.nproc, "runs": args.runs, "figures": figures}, f, indent=1)


if __name__ == "__main__":
    main()
