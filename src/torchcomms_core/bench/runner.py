"""What each rank of ``torchcomms bench`` does: check, warm up and time every operation over
the size sweep, then rank 0 prints nccl-tests style tables.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TextIO

import torch

from .. import _env
from ..bootstrap import resolve_rank_size
from ..comm import new_comm
from ..registry import get_backend_class
from .ops import (
    DTYPES,
    OPS,
    REDOPS,
    BenchOp,
    Buffers,
    Case,
    available_ops,
    dtype_name,
    unknown_ops_message,
)
from .sizes import size_sweep

#: Exit status of a run whose results were wrong on some rank.
EXIT_WRONG_RESULTS = 1


@dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a run; identical on every rank (it is pickled to each)."""

    backend: str = "gloo"
    device: str = "cpu"
    ops: tuple[str, ...] = tuple(OPS)
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    iters: int = 20
    warmup: int = 5
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    check: int = 1
    timeout_s: float | None = None

    @property
    def sizes(self) -> list[int]:
        return size_sweep(self.minbytes, self.maxbytes, self.stepfactor)


def validate_config(config: BenchConfig, nranks: int | None = None) -> None:
    """Raise ``ValueError`` (or a ``TorchCommError``) naming the first setting that cannot work.

    Runs before any rank starts, so a typo costs one message instead of one per rank.
    """
    size_sweep(config.minbytes, config.maxbytes, config.stepfactor)
    problem = unknown_ops_message(config.ops)
    if problem is not None:
        raise ValueError(f"--ops: {problem}")
    if config.dtype not in DTYPES:
        raise ValueError(f"unknown datatype {config.dtype!r}; choose from {', '.join(DTYPES)}")
    if config.redop not in REDOPS:
        raise ValueError(f"unknown reduction {config.redop!r}; choose from {', '.join(REDOPS)}")
    if config.iters < 1:
        raise ValueError(f"iters must be at least 1, got {config.iters}")
    if config.warmup < 0:
        raise ValueError(f"warmup_iters must not be negative, got {config.warmup}")
    if config.timeout_s is not None and config.timeout_s <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {config.timeout_s}")
    if nranks is not None and not 0 <= config.root < nranks:
        raise ValueError(f"root {config.root} is not a rank of a {nranks}-rank run; "
                         f"use 0..{nranks - 1}")
    dtype = DTYPES[config.dtype]
    if config.redop == "avg" and not dtype.is_floating_point:
        raise ValueError(f"--op avg needs a floating-point datatype, got {config.dtype}")
    ops = available_ops()
    for name in config.ops:
        reason = ops[name].refuses(dtype, config.redop)
        if reason is not None:
            raise ValueError(f"{name} {reason}; run it separately with other options")
    try:
        device_type = torch.device(config.device).type
    except RuntimeError as exc:
        raise ValueError(f"invalid device {config.device!r}: {exc}") from None

    cls = get_backend_class(config.backend)
    ok, reason = cls.is_available()
    if not ok:
        raise ValueError(f"backend {config.backend!r} cannot run here: {reason}")
    if device_type not in cls.devices:
        raise ValueError(f"backend {config.backend!r} runs on {', '.join(cls.devices)} devices, "
                         f"not {device_type!r}; pass --device {cls.devices[0]}")
    if dtype not in cls.supported_dtypes:
        supported = ", ".join(dtype_name(d) for d in cls.supported_dtypes)
        raise ValueError(f"backend {config.backend!r} does not support datatype "
                         f"{config.dtype} (supported: {supported})")


@dataclass
class Row:
    """One line of a table: one operation at one size."""

    op: str
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    busbw_factor: float
    #: Mean time per iteration on each rank, in microseconds, indexed by rank.
    times_us: list[float] = field(default_factory=list)
    #: Mismatching elements summed over ranks; ``None`` when not checked.
    wrong: int | None = None

    @property
    def time_us(self) -> float:
        # The slowest rank bounds the operation, as in nccl-tests.
        return max(self.times_us)

    @property
    def algbw(self) -> float:
        """GB/s (10**9 bytes) of the largest buffer."""
        return self.size / self.time_us / 1e3 if self.time_us > 0 else 0.0

    @property
    def busbw(self) -> float:
        return self.algbw * self.busbw_factor


class TextReport:
    """Prints the tables nccl-tests users know."""

    _COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
    _UNITS = ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "")
    _WIDTHS = (12, 14, 10, 7, 6, 11, 8, 8, 8)

    def __init__(self, out: TextIO | None = None) -> None:
        self._out = out if out is not None else sys.stdout

    def _line(self, text: str = "") -> None:
        print(text.rstrip(), file=self._out, flush=True)

    def _cells(self, cells: tuple[str, ...]) -> str:
        return "".join(cell.rjust(width) for cell, width in zip(cells, self._WIDTHS, strict=True))

    def start(self, config: BenchConfig, nranks: int) -> None:
        self._line(f"# torchcomms bench  minBytes {config.minbytes}  maxBytes {config.maxbytes}  "
                   f"step: {config.stepfactor}(factor)  warmup iters: {config.warmup}  "
                   f"iters: {config.iters}  validation: {config.check}")

    def begin_op(self, op: BenchOp, config: BenchConfig, nranks: int) -> None:
        self._line("#")
        self._line(f"# {op.name}: backend {config.backend}, {nranks} ranks, "
                   f"device {config.device}, dtype {dtype_name(DTYPES[config.dtype])}")
        self._line("#")
        self._line("#" + self._cells(self._COLUMNS)[1:])
        self._line("#" + self._cells(self._UNITS)[1:])

    def row(self, row: Row) -> None:
        t = row.time_us
        time_cell = f"{t:.2f}" if t < 1e6 else f"{t:.0f}"
        wrong = "N/A" if row.wrong is None else str(row.wrong)
        self._line(self._cells((str(row.size), str(row.count), row.dtype, row.redop,
                                str(row.root), time_cell, f"{row.algbw:.2f}",
                                f"{row.busbw:.2f}", wrong)))

    def end_op(self, rows: list[Row]) -> None:
        checked = [r.wrong for r in rows if r.wrong is not None]
        if checked:
            wrong = sum(checked)
            self._line(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}")
        else:
            self._line("# Out of bounds values : N/A (not checked)")
        avg = sum(r.busbw for r in rows) / len(rows) if rows else 0.0
        self._line(f"# Avg bus bandwidth    : {avg:g}")


def resolve_device(name: str, rank: int) -> torch.device:
    """The device this rank runs on: accelerators without an index get the local rank's."""
    device = torch.device(name)
    if device.type != "cpu" and device.index is None:
        local = _env.local_rank()
        device = torch.device(device.type, local if local is not None else rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _synchronize(device: torch.device) -> None:
    # Collectives on accelerators may return before the device finished them.
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        sync = getattr(module, "synchronize", None)
        if sync is not None:
            sync(device)


def _across_ranks(comm: Any, case: Case, seconds: float, wrong: int) -> tuple[list[float], int]:
    """Every rank's time (us) and the total of wrong elements, from one all_gather."""
    mine = torch.tensor([seconds * 1e6, float(wrong)], dtype=torch.float64, device=case.device)
    every = torch.empty(2 * case.nranks, dtype=torch.float64, device=case.device)
    comm.all_gather_single(every, mine)
    values = every.view(case.nranks, 2).cpu()
    return values[:, 0].tolist(), int(values[:, 1].sum().item())


def measure(comm: Any, op: BenchOp, bufs: Buffers, case: Case, config: BenchConfig) -> Row:
    """Check, warm up and time ``op`` on ``bufs``; collective, so every rank must call it."""
    # Fill even without checking: uninitialised memory may hold NaNs or denormals, which
    # make reductions on CPUs much slower than real data.
    op.fill(bufs, case)
    wrong = 0
    if config.check:
        op.run(comm, bufs, case)
        _synchronize(case.device)
        wrong = op.count_wrong(bufs, case)
    for _ in range(config.warmup):
        op.run(comm, bufs, case)
    _synchronize(case.device)
    comm.barrier()
    start = time.perf_counter()
    for _ in range(config.iters):
        op.run(comm, bufs, case)
    _synchronize(case.device)
    elapsed = (time.perf_counter() - start) / config.iters
    times_us, total_wrong = _across_ranks(comm, case, elapsed, wrong)
    return Row(op=op.name, size=bufs.count * case.itemsize, count=bufs.count,
               dtype=dtype_name(case.dtype), redop=op.redop_label(case),
               root=op.root_label(case), busbw_factor=op.busbw_factor(case.nranks),
               times_us=times_us, wrong=total_wrong if config.check else None)


def sweep(comm: Any, op: BenchOp, case: Case, config: BenchConfig) -> Iterator[Row]:
    """Measure ``op`` at every size of the sweep, yielding each row as soon as it is known."""
    last_count = None
    for nbytes in config.sizes:
        count = op.count(nbytes, case)
        # Small sizes can round to the same element count; measure each count once.
        if count == last_count:
            continue
        last_count = count
        yield measure(comm, op, op.allocate(count, case), case, config)


def run_benchmarks(comm: Any, config: BenchConfig, report: TextReport | None) -> list[Row]:
    """Run every operation of ``config`` on ``comm``; rank 0 passes the report to print to."""
    case = Case(rank=comm.get_rank(), nranks=comm.get_size(), dtype=DTYPES[config.dtype],
                device=comm.get_device(), redop=config.redop, root=config.root)
    rows: list[Row] = []
    if report is not None:
        report.start(config, case.nranks)
    ops = available_ops()
    for name in config.ops:
        op = ops[name]
        if report is not None:
            report.begin_op(op, config, case.nranks)
        op_rows = []
        for row in sweep(comm, op, case, config):
            op_rows.append(row)
            if report is not None:
                report.row(row)
        if report is not None:
            report.end_op(op_rows)
        rows.extend(op_rows)
    return rows


def run_rank(config: BenchConfig) -> int:
    """Benchmark on this process's rank (from the environment); returns the exit status."""
    rank, nranks, _source = resolve_rank_size()
    validate_config(config, nranks)
    device = resolve_device(config.device, rank)
    timeout = timedelta(seconds=config.timeout_s) if config.timeout_s is not None else None
    comm = new_comm(config.backend, device, name="bench", timeout=timeout)
    try:
        rows = run_benchmarks(comm, config, TextReport() if rank == 0 else None)
    finally:
        comm.finalize()
    # Every rank saw the same totals, so every rank returns the same status.
    return EXIT_WRONG_RESULTS if any(row.wrong for row in rows) else 0
