"""The tables ``torchcomms bench`` prints: nccl-tests' columns, one group per timing pass.

Each group holds time, per-rank min/avg/max, algbw, busbw and #wrong; ``--compare`` adds c10d.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

from torchcomms_core.bench.base import BenchOp
from torchcomms_core.bench.compare import COMPARE_WITH
from torchcomms_core.bench.data import IN_PLACE
from torchcomms_core.bench.results import Pass, Row, Timing
from torchcomms_core.bench.sizes import SMALL_SIZE

_KEY = (
    ("size", "(B)", 12),
    ("count", "(elements)", 12),
    ("type", "", 9),
    ("redop", "", 7),
    ("root", "", 6),
)
_PASS = (
    ("time", "(us)", 10),
    ("min", "(us)", 10),
    ("avg", "(us)", 10),
    ("max", "(us)", 10),
    ("algbw", "(GB/s)", 8),
    ("busbw", "(GB/s)", 8),
    ("#wrong", "", 7),
)
_COMPARE = (("c10d", "(us)", 10), ("ours/c10d", "median", 11), ("IQR", "", 13))
# The same columns when comparing with raw mpi4py (--compare mpi4py).
_COMPARE_MPI4PY = (("mpi4py", "(us)", 10), ("ours/mpi4py", "median", 12), ("IQR", "", 13))
NOT_APPLICABLE = "n/a"


def format_time(us: float) -> str:
    """Microseconds with as many decimals as fit the column."""
    if us < 1e4:
        return f"{us:.2f}"
    if us < 1e6:
        return f"{us:.1f}"
    return f"{us:.0f}"


def _bandwidth(value: float | None) -> str:
    return NOT_APPLICABLE if value is None else f"{value:.2f}"


class TextReport:
    """Prints one table per operation, rows as soon as they are measured."""

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out if out is not None else sys.stdout
        self._compare = False
        self._passes = 1
        self._them = "c10d"
        #: Whether the next table has the ``algorithm`` column (the backend declares
        #: algorithms for its operation; other tables keep nccl-tests' columns).
        self.algorithm_column = False

    def _line(self, text: str = "") -> None:
        print(text.rstrip(), file=self._out, flush=True)

    def _group(self) -> tuple[tuple[str, str, int], ...]:
        if not self._compare:
            return _PASS
        return _PASS + (_COMPARE_MPI4PY if self._them == "mpi4py" else _COMPARE)

    def _cells(self, cells: list[str]) -> str:
        widths = [w for _n, _u, w in _KEY] + [w for _n, _u, w in self._group()] * self._passes
        return "".join(cell.rjust(width) for cell, width in zip(cells, widths, strict=True))

    def start(self, config: Any, nranks: int) -> None:
        compare = f"  compare: {config.compare}" if config.compare else ""
        self._line(
            f"# torchcomms bench  minBytes {config.minbytes}  maxBytes {config.maxbytes}  "
            f"step: {config.stepfactor}(factor)  warmup iters: {config.warmup}  "
            f"iters: {config.iters}  validation: {config.check}  "
            f"inplace: {config.inplace}{compare}"
        )
        if getattr(config, "network", None):
            self._line(f"# network: {config.network}")
        self._line(
            "# time: the slowest rank's mean per call; min/avg/max: over ranks of each rank's mean"
        )
        small = getattr(config, "small_iters", config.iters)
        if small != config.iters and config.minbytes < SMALL_SIZE:
            self._line(
                f"# timed calls (mean): {small} per size below {SMALL_SIZE} bytes, "
                f"{config.iters} from there"
            )
        else:
            self._line(f"# timed calls (mean): {config.iters} per size")
        self._them = config.compare or "c10d"
        if config.compare == "mpi4py":
            self._line(
                "# mpi4py: raw blocking mpi4py calls on the same tensors, calls "
                "interleaved A/B; ours/mpi4py: median of per-call ratios, IQR: their "
                "quartiles"
            )
        elif config.compare and config.compare != "c10d":
            self._line(
                f"# then the same sweep on the same ranks through backend {config.compare}, "
                f"and a table of the ratios"
            )
        elif config.compare:
            self._line(
                "# c10d: torch.distributed on the same engine and tensors, calls "
                "interleaved A/B; ours/c10d: median of per-call ratios, IQR: their "
                "quartiles"
            )

    def begin_op(
        self, op: BenchOp, config: Any, nranks: int, forms: tuple[str, ...], c10d: str | None
    ) -> None:
        """Print the table header; ``c10d`` is the equivalent's description when comparing."""
        # Compared call by call (c10d, mpi4py); another backend runs its own pass instead.
        self._compare = config.compare in COMPARE_WITH
        self._passes = len(forms)
        self._line("#")
        self._line(
            f"# {op.name}: backend {config.backend}, {nranks} ranks, "
            f"device {config.device}, dtype {config.dtype}"
        )
        if self._compare:
            self._line(f"# compared with: {c10d}")
        self._line("#")
        group = self._group()
        key_width = sum(w for _n, _u, w in _KEY)
        group_width = sum(w for _n, _u, w in group)
        if self._passes > 1 or IN_PLACE in forms:
            self._line(
                "#" + (" " * (key_width - 1)) + "".join(form.center(group_width) for form in forms)
            )
        names = [n for n, _u, _w in _KEY] + [n for n, _u, _w in group] * self._passes
        units = [u for _n, u, _w in _KEY] + [u for _n, u, _w in group] * self._passes
        self._line("#" + self._cells(names)[1:] + ("  algorithm" if self.algorithm_column else ""))
        self._line("#" + self._cells(units)[1:])

    def _timing_cells(self, row: Row, timing: Timing) -> list[str]:
        wrong = "N/A" if timing.wrong is None or not row.moves_data else str(timing.wrong)
        return [
            format_time(timing.time_us),
            format_time(timing.min_us),
            format_time(timing.avg_us),
            format_time(timing.max_us),
            _bandwidth(row.algbw(timing)),
            _bandwidth(row.busbw(timing)),
            wrong,
        ]

    def _compare_cells(self, p: Pass) -> list[str]:
        if p.c10d is None or p.ratio is None:
            return [NOT_APPLICABLE] * len(_COMPARE)  # both column sets have three
        q1, median, q3 = p.ratio
        return [format_time(p.c10d.time_us), f"{median:.3f}", f"{q1:.2f}-{q3:.2f}"]

    def row(self, row: Row) -> None:
        cells = [str(row.size), str(row.count), row.dtype, row.redop, str(row.root)]
        for p in row.passes:
            cells += self._timing_cells(row, p.ours)
            if self._compare:
                cells += self._compare_cells(p)
        # The backend's chosen algorithm (#45).
        chosen = "  " + (row.algorithm or "-") if self.algorithm_column else ""
        self._line(self._cells(cells) + chosen)

    def end_op(self, rows: list[Row]) -> None:
        ours = [p.ours for r in rows for p in r.passes]
        checked = [t.wrong for t in ours if t.wrong is not None]
        if not checked or not any(r.moves_data for r in rows):
            self._line("# Out of bounds values : N/A (not checked)")
        else:
            wrong = sum(checked)
            theirs = [
                p.c10d.wrong
                for r in rows
                for p in r.passes
                if p.c10d is not None and p.c10d.wrong is not None
            ]
            c10d = (
                f" ({self._them}: {sum(theirs)} {'OK' if sum(theirs) == 0 else 'FAILED'})"
                if theirs
                else ""
            )
            self._line(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}{c10d}")
        self._line(f"# Avg bus bandwidth    : {_average_busbw(rows, c10d=False)}")
        if self._compare:
            self._line(f"# Avg bus bandwidth {self._them}: {_average_busbw(rows, c10d=True)}")


def _average_busbw(rows: list[Row], c10d: bool) -> str:
    values = []
    for r in rows:
        for p in r.passes:
            timing = p.c10d if c10d else p.ours
            busbw = None if timing is None else r.busbw(timing)
            if busbw is not None:
                values.append(busbw)
    return f"{sum(values) / len(values):g}" if values else NOT_APPLICABLE
