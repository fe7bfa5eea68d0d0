"""Quantized against float32 all-reduce over emulated links of several rates (needs root).

Runs ``torchcomms bench --netns N --link-rate R --ops all_reduce,quantized_all_reduce`` for
each rate, prints time per call and the speedup, and the crossover rate above which
float32 wins; ``--plot`` draws both times and the speedup against the link rate.

    python benchmarks/quantized_link_rates.py --nproc 2 --rates 100mbit,1gbit,10gbit
    python benchmarks/quantized_link_rates.py --nproc 4 --size 64M --plot rates.png
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from typing import Any

from torchcomms_core.bench.netns import format_rate, parse_rate, unavailable_reason

DEFAULT_RATES = "100mbit,250mbit,500mbit,1gbit,2gbit,4gbit,10gbit"


def measure(nproc: int, rate: str, size: str, iters: int) -> dict[str, Any]:
    """Times (us) of both all-reduces at one rate, from one ``torchcomms bench`` run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run.json")
        cmd = [
            sys.executable,
            "-m",
            "torchcomms_core.cli",
            "bench",
            "--netns",
            str(nproc),
            "--link-rate",
            rate,
            "--ops",
            "all_reduce,quantized_all_reduce",
            "-b",
            size,
            "-e",
            size,
            "-n",
            str(iters),
            "-w",
            "1",
            "--json",
            path,
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stdout}{done.stderr}")
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
    times = {}
    for row in document["rows"]:
        (result,) = row["passes"]
        if result["wrong"]:
            raise SystemExit(f"{row['op']} at {rate}: {result['wrong']} wrong elements")
        times[row["op"]] = result["time_us"]
    return {
        "rate": rate,
        "rate_bits": parse_rate(rate),
        "fp32_us": times["all_reduce"],
        "quantized_us": times["quantized_all_reduce"],
        "load": os.getloadavg()[0],
    }


def crossover(points: list[dict[str, Any]]) -> str:
    """The rate above which float32 is faster, interpolated on log axes between points."""
    points = sorted(points, key=lambda p: p["rate_bits"])
    speedups = [p["fp32_us"] / p["quantized_us"] for p in points]
    for i in range(len(points) - 1):
        a, b, sa, sb = points[i], points[i + 1], speedups[i], speedups[i + 1]
        if sa >= 1.0 > sb:
            la, lb = math.log(a["rate_bits"]), math.log(b["rate_bits"])
            t = math.log(sa) / (math.log(sa) - math.log(sb))
            return f"~{format_rate(int(round(math.exp(la + t * (lb - la)), -6)))}"
    if speedups and speedups[-1] >= 1.0:
        return f"above {points[-1]['rate']} (quantized still wins there)"
    return f"below {points[0]['rate']} (float32 already wins there)"


def plot(points: list[dict[str, Any]], nproc: int, size: str, path: str) -> None:
    from matplotlib.figure import Figure

    points = sorted(points, key=lambda p: p["rate_bits"])
    rates = [p["rate_bits"] / 1e9 for p in points]
    fig = Figure(figsize=(10, 4), layout="constrained")
    fig.suptitle(
        f"all_reduce of {size}B float32, {nproc} ranks in network namespaces, tc tbf links"
    )
    left, right = fig.subplots(1, 2)
    left.plot(rates, [p["fp32_us"] / 1e3 for p in points], "o--", label="all_reduce (float32)")
    left.plot(
        rates, [p["quantized_us"] / 1e3 for p in points], "o-", label="quantized_all_reduce (int8)"
    )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("link rate (Gbit/s, each way)")
    left.set_ylabel("time per call (ms)")
    left.legend()
    left.grid(True, which="both", alpha=0.3)
    right.plot(rates, [p["fp32_us"] / p["quantized_us"] for p in points], "o-")
    right.axhline(1.0, color="grey", linewidth=1)
    right.axhline(3.0, color="grey", linewidth=1, linestyle=":")
    right.set_xscale("log")
    right.set_xlabel("link rate (Gbit/s, each way)")
    right.set_ylabel("speedup (float32 time / quantized time)")
    right.grid(True, which="both", alpha=0.3)
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--rates", default=DEFAULT_RATES)
    parser.add_argument("--size", default="64M")
    parser.add_argument("-n", "--iters", type=int, default=4)
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument("--plot", dest="plot_path", default=None)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        parser.error(reason)
    points = []
    print(f"# {args.nproc} ranks, {args.size}B float32, times per call (slowest rank's mean)")
    print(f"# {'link':>9} {'fp32 (ms)':>10} {'int8 (ms)':>10} {'speedup':>8} {'load':>5}")
    for rate in args.rates.split(","):
        point = measure(args.nproc, rate.strip(), args.size, args.iters)
        points.append(point)
        print(
            f"  {point['rate']:>9} {point['fp32_us'] / 1e3:10.1f} "
            f"{point['quantized_us'] / 1e3:10.1f} "
            f"{point['fp32_us'] / point['quantized_us']:8.2f} {point['load']:5.1f}",
            flush=True,
        )
    print(f"# crossover (float32 wins above): {crossover(points)}")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump({"nproc": args.nproc, "size": args.size, "points": points}, f, indent=1)
    if args.plot_path:
        plot(points, args.nproc, args.size, args.plot_path)
        print(f"# plot written to {args.plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
