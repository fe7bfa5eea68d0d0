"""Plot ``benchmarks/scale.py --json`` figures: store operations per rank and projected time.

    python benchmarks/scale.py --json after.json
    python benchmarks/scale.py --sizes 16 64 --eager --json eager.json
    python benchmarks/scale_plot.py after.json --eager eager.json --out docs/images/scaling.svg

Left: ``new_comm`` + ``split`` into groups of 8, store operations per rank against N, as
measured (points) and as the fitted line the projection uses. Right: the projected time of
those two steps against one store, ``N * ops(N) / R`` (the model in docs/scaling.md), from
the store throughput R each run measured. Needs matplotlib.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def _series(figures: dict[str, Any]) -> tuple[list[int], list[float]]:
    sizes = sorted(int(n) for n in figures["sizes"])
    ops = [
        figures["sizes"][str(n)]["new_comm"]["ops_mean"]
        + figures["sizes"][str(n)]["split/8"]["ops_mean"]
        for n in sizes
    ]
    return sizes, ops


def _fit(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """Least squares ``y = a + b x``, as ``scale.py`` projects."""
    if len(xs) < 2:
        return ys[0], 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return my - b * mx, b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("after", help="JSON of a lazy run")
    parser.add_argument("--eager", help="JSON of an --eager run (torch's full mesh)")
    parser.add_argument("--out", default="scaling.svg")
    args = parser.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [("lazy, constant control plane", args.after, "tab:green")]
    if args.eager:
        runs.append(("eager full mesh (torch's default)", args.eager, "tab:red"))
    grid = [2**k for k in range(4, 18)]  # 16 .. 131072
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, path, colour in runs:
        with open(path) as f:
            figures = json.load(f)
        sizes, ops = _series(figures)
        a, b = _fit(sizes, ops)
        rate = figures["store_ops_per_s"]["16"]
        left.plot(sizes, ops, "o", color=colour)
        left.plot(grid, [a + b * n for n in grid], "-", color=colour, label=label)
        right.plot(grid, [n * (a + b * n) / rate for n in grid], "-", color=colour, label=label)
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks N")
        ax.grid(True, which="both", alpha=0.3)
    left.set_ylabel("store operations per rank")
    left.set_title("new_comm + split/8: store ops per rank")
    right.set_ylabel("seconds against one TCPStore")
    right.set_title("projected time of new_comm + split/8")
    right.axhline(30, color="grey", linestyle=":", label="30 s")
    left.legend(fontsize=8)
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
