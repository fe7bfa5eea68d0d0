"""The figures one ``torchcomms bench`` run produces, and their JSON form.

A :class:`Row` is one operation at one size; it holds one :class:`Pass` per buffer layout timed.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import socket
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, TextIO

import torch

#: Version of the JSON layout; bumped when a field changes meaning or goes away.
JSON_FORMAT = 1


@dataclass
class Timing:
    """One implementation's time in one pass, from every rank."""

    #: Mean microseconds per call on each rank, by rank; ``None`` for ranks not taking part.
    rank_times_us: list[float | None]
    #: Mismatching elements summed over ranks; ``None`` when not checked.
    wrong: int | None = None

    @property
    def _taking_part(self) -> list[float]:
        return [t for t in self.rank_times_us if t is not None]

    @property
    def time_us(self) -> float:
        """The slowest rank's mean: it bounds the operation, as in nccl-tests."""
        return self.max_us

    @property
    def min_us(self) -> float:
        return min(self._taking_part)

    @property
    def avg_us(self) -> float:
        return statistics.fmean(self._taking_part)

    @property
    def max_us(self) -> float:
        return max(self._taking_part)


@dataclass
class Pass:
    """One timing pass: an operation in one form (out-of-place or in-place)."""

    form: str
    ours: Timing
    #: ``torch.distributed``'s time on the same tensors, when compared.
    c10d: Timing | None = None
    #: Why there is no c10d time although one was asked for (e.g. no equivalent).
    c10d_note: str | None = None
    #: Quartiles ``(q1, median, q3)`` of the per-call ratios ours / c10d.
    ratio: tuple[float, float, float] | None = None
    #: The algorithm the backend chose for the timed calls ("" when it declares none).
    algorithm: str = ""


@dataclass
class Row:
    """One line of a table: one operation at one size."""

    op: str
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    nranks: int
    busbw_factor: float
    #: ``False`` for operations without data (barrier): no bandwidth.
    moves_data: bool = True
    passes: list[Pass] = field(default_factory=list)
    #: Calls timed per pass (see ``BenchConfig.timed_calls``).
    timed: int = 0
    #: The algorithm the backend chose for this row (``Choice`` as text; "" when the
    #: backend declares none for the operation, #45).
    algorithm: str = ""

    def algbw(self, timing: Timing) -> float | None:
        """GB/s (10**9 bytes) of the largest buffer, or ``None`` without data."""
        if not self.moves_data:
            return None
        t = timing.time_us
        return self.size / t / 1e3 if t > 0 else 0.0

    def busbw(self, timing: Timing) -> float | None:
        algbw = self.algbw(timing)
        return None if algbw is None else algbw * self.busbw_factor

    @property
    def wrong(self) -> int:
        """Wrong elements in every pass, of torchcomms and of c10d."""
        total = 0
        for p in self.passes:
            for timing in (p.ours, p.c10d):
                if timing is not None and timing.wrong:
                    total += timing.wrong
        return total


def _timing_dict(row: Row, timing: Timing) -> dict[str, Any]:
    return {
        "time_us": timing.time_us,
        "min_us": timing.min_us,
        "avg_us": timing.avg_us,
        "max_us": timing.max_us,
        "algbw_gbps": row.algbw(timing),
        "busbw_gbps": row.busbw(timing),
        "wrong": timing.wrong,
        "rank_times_us": timing.rank_times_us,
    }


def row_dict(row: Row) -> dict[str, Any]:
    """Every field of ``row``, with the derived figures the table prints."""
    passes = []
    for p in row.passes:
        entry: dict[str, Any] = {"form": p.form, **_timing_dict(row, p.ours)}
        entry["c10d"] = None if p.c10d is None else _timing_dict(row, p.c10d)
        entry["c10d_note"] = p.c10d_note
        if p.ratio is not None:
            q1, median, q3 = p.ratio
            entry["ratio"] = {"median": median, "q1": q1, "q3": q3}
        else:
            entry["ratio"] = None
        passes.append(entry)
    return {
        "op": row.op,
        "size": row.size,
        "count": row.count,
        "type": row.dtype,
        "redop": row.redop,
        "root": row.root,
        "nranks": row.nranks,
        "busbw_factor": row.busbw_factor,
        "moves_data": row.moves_data,
        "timed_calls": row.timed,
        "algorithm": row.algorithm or None,
        "passes": passes,
    }


def header_dict(
    config: Any,
    nranks: int,
    c10d_functions: dict[str, str | None],
    started: datetime.datetime | None = None,
) -> dict[str, Any]:
    """What the run was: engine, machine, software and options; ``started`` is when (UTC)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    started = started or now
    from torchcomms_core import __version__

    return {
        "format": JSON_FORMAT,
        "backend": config.backend,
        "device": config.device,
        "ranks": nranks,
        "dtype": config.dtype,
        "redop": config.redop,
        "root": config.root,
        "ops": list(config.ops),
        "minbytes": config.minbytes,
        "maxbytes": config.maxbytes,
        "stepfactor": config.stepfactor,
        "iters": config.iters,
        "small_iters": getattr(config, "small_iters", config.iters),
        "warmup_iters": config.warmup,
        "check": config.check,
        "inplace": config.inplace,
        "compare": config.compare,
        "network": getattr(config, "network", None),
        "c10d_functions": c10d_functions if config.compare else {},
        "torch_version": torch.__version__,
        "torchcomms_version": __version__,
        "python_version": platform.python_version(),
        "hostname": socket.gethostname(),
        "cpu_count": os.cpu_count(),
        "date": started.isoformat(timespec="seconds"),
        "duration_s": round((now - started).total_seconds(), 1),
        "argv": sys.argv[1:],
    }


def write_json(document: dict[str, Any], path: str, stdout: TextIO | None = None) -> None:
    """Write ``document`` to ``path``; ``-`` means standard output."""
    text = json.dumps(document, indent=1, allow_nan=False)
    if path == "-":
        out = stdout if stdout is not None else sys.stdout
        print(text, file=out, flush=True)
        return
    with open(path, "w", encoding="utf-8") as f:
        f.write(text + "\n")
