"""``--plot``: bus bandwidth against message size, one panel per operation, on log axes.

Reads the documents ``--json`` writes, so saved runs can be plotted together later.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: What to install when matplotlib is missing.
INSTALL_HINT = "pip install 'torchcomms-core[plot]' (or pip install matplotlib)"

_COLUMNS = 3


def require_matplotlib() -> None:
    """Raise ``ValueError`` with the command that installs matplotlib when it is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError(
            f"--plot needs matplotlib, which is not installed; {INSTALL_HINT}"
        ) from None


def format_bytes(value: float, _pos: Any = None) -> str:
    """Axis label of a byte count: 8, 1K, 64M (powers of 1024, as ``-b`` and ``-e`` take)."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value >= scale:
            scaled = value / scale
            return f"{scaled:.0f}{suffix}" if scaled == int(scaled) else f"{scaled:.3g}{suffix}"
    return f"{value:.0f}"


def _series(
    documents: Sequence[dict[str, Any]],
) -> dict[str, dict[tuple[str, str], list[tuple[int, float]]]]:
    """``{op: {(group, implementation): [(size, busbw), ...]}}`` over every document.

    A group is what tells runs and passes apart (backend, ranks, form), when they differ.
    """
    many_ranks = len({d["header"]["ranks"] for d in documents}) > 1
    many_backends = len({d["header"]["backend"] for d in documents}) > 1
    by_op: dict[str, dict[tuple[str, str], list[tuple[int, float]]]] = {}
    for doc in documents:
        head = doc["header"]
        for row in doc["rows"]:
            if not row["moves_data"]:
                continue
            forms = {p["form"] for p in row["passes"]}
            for p in row["passes"]:
                parts = []
                if many_backends:
                    parts.append(head["backend"])
                if many_ranks:
                    parts.append(f"{head['ranks']} ranks")
                if len(forms) > 1:
                    parts.append(p["form"])
                group = " ".join(parts)
                for impl, figures in (("torchcomms", p), ("c10d", p.get("c10d"))):
                    if figures is None or figures.get("busbw_gbps") is None:
                        continue
                    by_op.setdefault(row["op"], {}).setdefault((group, impl), []).append(
                        (row["size"], figures["busbw_gbps"])
                    )
    return by_op


def _title(documents: Sequence[dict[str, Any]]) -> str:
    first = documents[0]["header"]
    backends = ", ".join(sorted({d["header"]["backend"] for d in documents}))
    ranks = ", ".join(str(r) for r in sorted({d["header"]["ranks"] for d in documents}))
    return (
        f"torchcomms bench: bus bandwidth, {backends} on {first['device']}, {ranks} ranks, "
        f"{first['dtype']}  ({first['hostname']}, torch {first['torch_version']}, "
        f"{first['date'][:10]})"
    )


def plot_results(documents: dict[str, Any] | Sequence[dict[str, Any]], path: str) -> None:
    """Save a PNG (or any format matplotlib infers from ``path``) of busbw against size."""
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, LogLocator

    docs = [documents] if isinstance(documents, dict) else list(documents)
    by_op = _series(docs)
    if not by_op:
        raise ValueError(
            "nothing to plot: no operation with a bandwidth was measured (barrier has none)"
        )
    columns = min(_COLUMNS, len(by_op))
    rows = math.ceil(len(by_op) / columns)
    fig = Figure(figsize=(5.2 * columns, 3.9 * rows + 0.6), layout="constrained")
    fig.suptitle(_title(docs), fontsize=11)
    axes = fig.subplots(rows, columns, squeeze=False)
    groups = list(dict.fromkeys(g for series in by_op.values() for g, _impl in series))
    colors = {g: f"C{i % 10}" for i, g in enumerate(groups)}
    for ax, (op, series) in zip(axes.flat, by_op.items(), strict=False):
        # One colour per run and pass; torchcomms solid, torch.distributed dashed.
        for (group, impl), points in series.items():
            points.sort()
            sizes = [s for s, _b in points]
            busbw = [max(b, 1e-6) for _s, b in points]
            ours = impl == "torchcomms"
            ax.plot(
                sizes,
                busbw,
                "-" if ours else "--",
                color=colors[group],
                marker="o" if ours else "x",
                markersize=3.5,
                linewidth=1.5 if ours else 1.2,
                label=f"{impl} {group}".strip(),
            )
        ax.set_title(op, fontsize=11)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=4))
        ax.xaxis.set_major_formatter(FuncFormatter(format_bytes))
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.12)
        ax.legend(fontsize=8, loc="upper left")
    for ax in list(axes.flat)[len(by_op) :]:
        ax.set_visible(False)
    fig.savefig(path, dpi=80)
