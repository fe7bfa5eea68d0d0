"""Time from SIGKILL to the first successful collective on the new membership.

Runs ``examples/elastic_training.py`` (4 workers, gloo) ``--runs`` times without a
replacement and reports the median and range of each phase:

* detect: kill -> the last survivor's all-reduce raised;
* quorum: the slowest survivor's wait for the membership (dominated by ``--stale``, the
  heartbeat age that declares a member dead);
* reconfigure: the slowest survivor's ``comm.reconfigure`` (membership check + new engine);
* recover: kill -> the first collective on the new membership completed.

    python benchmarks/recovery.py                  # 5 runs, --stale 0.5 and 1.0
    python benchmarks/recovery.py --runs 3 --stale 0.5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "elastic_training.py")
PHASES = ("detect_s", "quorum_s", "reconfigure_s", "recover_s")


def one_run(nproc: int, stale: float, timeout: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "run.json")
        proc = subprocess.run(
            [
                sys.executable,
                EXAMPLE,
                "--nproc",
                str(nproc),
                "--steps",
                "10",
                "--kill-at",
                "4",
                "--rejoin-at",
                "-1",
                "--stale",
                str(stale),
                "--timeout",
                str(timeout),
                "--json",
                out,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"elastic_training.py failed:\n{proc.stdout}\n{proc.stderr}")
        with open(out) as f:
            res = json.load(f)
    return {k: float(res[k]) for k in PHASES}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--stale", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--timeout", type=float, default=2.0, help="communicator timeout, s")
    args = p.parse_args()
    print(
        "| heartbeat stale (s) | comm timeout (s) | detect (s) | quorum (s) | "
        "reconfigure (s) | kill -> first collective (s), median [min-max] |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for stale in args.stale:
        runs = [one_run(args.nproc, stale, args.timeout) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in PHASES}
        lo = min(r["recover_s"] for r in runs)
        hi = max(r["recover_s"] for r in runs)
        print(
            f"| {stale} | {args.timeout} | {med['detect_s']:.3f} | {med['quorum_s']:.3f} | "
            f"{med['reconfigure_s']:.3f} | {med['recover_s']:.3f} [{lo:.3f}-{hi:.3f}] |",
            flush=True,
        )


if __name__ == "__main__":
    main()
