"""What each rank of ``torchcomms bench`` does: check, warm up and time every operation over
the size sweep, optionally against torch.distributed; rank 0 reports.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.bench.base import BenchOp
from torchcomms_core.bench.compare import (
    COMPARE_WITH,
    c10d_backend,
    close_c10d,
    init_c10d,
    quartiles,
)
from torchcomms_core.bench.data import DTYPES, REDOPS, Buffers, Case, dtype_name
from torchcomms_core.bench.ops import DEFAULT_OPS, available_ops, unknown_ops_message
from torchcomms_core.bench.report import TextReport
from torchcomms_core.bench.results import Pass, Row, Timing, header_dict, row_dict, write_json
from torchcomms_core.bench.sizes import DEFAULT_ITERS, SMALL_MIN_CALLS, SMALL_SIZE, size_sweep
from torchcomms_core.comm.create import new_comm
from torchcomms_core.creation.bootstrap import resolve_rank_size
from torchcomms_core.foundation import env as _env
from torchcomms_core.plugin_host.backends import get_backend_class

#: Exit status of a run whose results were wrong on some rank.
EXIT_WRONG_RESULTS = 1
#: What ``--inplace`` accepts: out-of-place only, in-place only, or both.
INPLACE_CHOICES: tuple[str, ...] = ("0", "1", "both")


@dataclass(frozen=True)
class BenchConfig:
    """Everything that defines a run; identical on every rank (it is pickled to each)."""

    backend: str = "gloo"
    device: str = "cpu"
    ops: tuple[str, ...] = DEFAULT_OPS
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 2
    iters: int = DEFAULT_ITERS
    #: Calls timed per size below ``SMALL_SIZE`` (``--iters`` when given).
    small_iters: int = SMALL_MIN_CALLS
    warmup: int = 5
    dtype: str = "float32"
    redop: str = "sum"
    root: int = 0
    check: int = 1
    timeout_s: float | None = None
    inplace: str = "both"
    compare: str | None = None
    #: Where rank 0 writes every row as JSON; ``-`` is standard output (tables go to stderr).
    json_path: str | None = None
    #: Where rank 0 saves a busbw-vs-size plot (needs matplotlib).
    plot_path: str | None = None
    #: The emulated network the ranks talk over (``--netns``), described; ``None``: the host's.
    network: str | None = None

    @property
    def sizes(self) -> list[int]:
        return size_sweep(self.minbytes, self.maxbytes, self.stepfactor)

    def timed_calls(self, nbytes: int) -> int:
        """Calls timed at a size of ``nbytes``."""
        return self.small_iters if nbytes < SMALL_SIZE else self.iters


def runnable_ops(config: BenchConfig, nranks: int) -> tuple[list[str], list[str]]:
    """Split every available operation into those that can run with ``config`` at ``nranks``
    ranks and, for the others, lines saying why not (what ``--ops all`` skips)."""
    dtype = DTYPES[config.dtype]
    names, skipped = [], []
    for name, op in available_ops().items():
        reason = op.refuses(dtype, config.redop, nranks)
        if reason is None:
            names.append(name)
        else:
            skipped.append(f"{name} {reason}")
    return names, skipped


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
    if config.iters < 1 or config.small_iters < 1:
        raise ValueError(f"iters must be at least 1, got {min(config.iters, config.small_iters)}")
    if config.warmup < 0:
        raise ValueError(f"warmup_iters must not be negative, got {config.warmup}")
    if config.timeout_s is not None and config.timeout_s <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {config.timeout_s}")
    if config.inplace not in INPLACE_CHOICES:
        raise ValueError(
            f"--inplace must be one of {', '.join(INPLACE_CHOICES)}, got {config.inplace!r}"
        )
    if config.compare is not None:
        if config.compare not in COMPARE_WITH:
            check_compare_backend(config)
        elif config.compare == "mpi4py":
            from torchcomms_core.bench.compare_mpi import check_backend

            check_backend(config.backend)
        else:
            c10d_backend(config.backend)
    if nranks is not None and not 0 <= config.root < nranks:
        raise ValueError(
            f"root {config.root} is not a rank of a {nranks}-rank run; use 0..{nranks - 1}"
        )
    dtype = DTYPES[config.dtype]
    if config.redop == "avg" and not dtype.is_floating_point:
        raise ValueError(f"--op avg needs a floating-point datatype, got {config.dtype}")
    ops = available_ops()
    for name in config.ops:
        reason = ops[name].refuses(dtype, config.redop, nranks)
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
        raise ValueError(
            f"backend {config.backend!r} runs on {', '.join(cls.devices)} devices, "
            f"not {device_type!r}; pass --device {cls.devices[0]}"
        )
    if dtype not in cls.supported_dtypes:
        supported = ", ".join(dtype_name(d) for d in cls.supported_dtypes)
        raise ValueError(
            f"backend {config.backend!r} does not support datatype "
            f"{config.dtype} (supported: {supported})"
        )


def compares_backends(config: BenchConfig) -> bool:
    """Whether ``--compare`` names another torchcomms backend (a second pass), not c10d/mpi4py."""
    return config.compare is not None and config.compare not in COMPARE_WITH


def check_compare_backend(config: BenchConfig) -> None:
    """Raise ``ValueError`` unless ``--compare`` names a backend that can run this config."""
    from torchcomms_core.foundation.errors import TorchCommError

    assert config.compare is not None
    try:
        get_backend_class(config.compare)
    except TorchCommError as exc:
        raise ValueError(
            f"--compare {config.compare!r} is neither {' nor '.join(COMPARE_WITH)} nor a "
            f"torchcomms backend that loads here: {exc}"
        ) from None
    if config.compare == config.backend:
        raise ValueError(f"--compare {config.compare}: compare --backend with another backend")
    validate_config(dataclasses.replace(config, backend=config.compare, compare=None))


def resolve_device(name: str, rank: int) -> torch.device:
    """The device this rank runs on: accelerators without an index get the local rank's."""
    device = torch.device(name)
    if device.type != "cpu" and device.index is None:
        local = _env.local_rank()
        device = torch.device(device.type, local if local is not None else rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def _synchronizer(device: torch.device) -> Callable[[], None]:
    # Collectives on accelerators may return before the device finished them.
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        sync = getattr(module, "synchronize", None)
        if sync is not None:
            return lambda: sync(device)
    return lambda: None


@dataclass
class Runner:
    """Times operations on one rank: ``comm`` always, ``dist`` (torch.distributed) to compare."""

    comm: Any
    case: Case
    config: BenchConfig
    dist: Any = None
    c10d_backend: str | None = None

    def __post_init__(self) -> None:
        self._sync = _synchronizer(self.case.device)
        self._calls = self.config.iters

    def c10d_note(self, op: BenchOp) -> str | None:
        """Why ``op`` is not compared, or ``None`` when it is (or no comparison was asked)."""
        if self.dist is None or self.c10d_backend is None:
            return None
        refuses = getattr(self.dist, "refuses", None)  # raw mpi4py (--compare mpi4py)
        if refuses is not None:
            note: str | None = refuses(op, self.case)
            return note
        return op.c10d_refuses(self.case, self.c10d_backend)

    def measure(self, op: BenchOp, bufs: Buffers, calls: int | None = None) -> Pass:
        """Check, warm up and time ``op`` on ``bufs`` (``calls`` timed calls, by default
        ``--iters``); collective, so every rank calls it."""
        comm, case, config = self.comm, self.case, self.config
        self._calls = config.iters if calls is None else calls
        compare = self.dist is not None and self.c10d_note(op) is None
        ours = functools.partial(op.run, comm, bufs, case)
        theirs = functools.partial(op.run_c10d, self.dist, bufs, case)
        checked = bool(config.check) and op.moves_data
        # Fill even without checking: uninitialised memory may hold denormals, which make
        # reductions on CPUs much slower than real data.
        wrong = self._check(op, bufs, ours, checked)
        c10d_wrong = self._check(op, bufs, theirs, checked) if compare else 0
        for _ in range(config.warmup):
            ours()
            if compare:
                theirs()
        self._sync()
        comm.barrier()
        if compare:
            ours_us, theirs_us = self._interleaved(ours, theirs)
        elif self.dist is not None:
            # Timed call by call like the compared operations, so one run's tables agree.
            ours_us, theirs_us = self._interleaved(ours, None)
        else:
            ours_us, theirs_us = self._batch(ours), []
        # Read before _gather, whose own all_gather_single would overwrite it (#45).
        algorithm = chosen_algorithm(comm, op.name)
        result = self._gather(
            op,
            bufs.form,
            ours_us,
            theirs_us,
            wrong if checked else None,
            c10d_wrong if checked else None,
            compare,
        )
        result.algorithm = algorithm
        return result

    def _check(self, op: BenchOp, bufs: Buffers, call: Callable[[], None], checked: bool) -> int:
        op.fill(bufs, self.case)
        if not checked:
            return 0
        call()
        self._sync()
        return op.count_wrong(bufs, self.case)

    def _batch(self, call: Callable[[], None]) -> list[float]:
        """One mean over all iterations, timed as a block (no per-call synchronisation)."""
        iters = self._calls
        start = time.perf_counter()
        for _ in range(iters):
            call()
        self._sync()
        return [(time.perf_counter() - start) / iters * 1e6]

    def _interleaved(
        self, ours: Callable[[], None], theirs: Callable[[], None] | None
    ) -> tuple[list[float], list[float]]:
        """Per-call microseconds of both, alternating which goes first (``theirs`` optional).

        Every rank uses the same order, so the collectives match; alternating spreads
        drift, caches and the cost of going first evenly over both.
        """
        sync, clock = self._sync, time.perf_counter
        ours_us: list[float] = []
        theirs_us: list[float] = []
        for i in range(self._calls):
            if theirs is not None and i % 2:
                t0 = clock()
                theirs()
                sync()
                theirs_us.append((clock() - t0) * 1e6)
            t0 = clock()
            ours()
            sync()
            ours_us.append((clock() - t0) * 1e6)
            if theirs is not None and not i % 2:
                t0 = clock()
                theirs()
                sync()
                theirs_us.append((clock() - t0) * 1e6)
        return ours_us, theirs_us

    def _gather(
        self,
        op: BenchOp,
        form: str,
        ours_us: list[float],
        theirs_us: list[float],
        wrong: int | None,
        c10d_wrong: int | None,
        compare: bool,
    ) -> Pass:
        """Every rank's figures, from one all_gather over ``comm``."""
        case = self.case
        mine = [
            1.0 if op.participates(case) else 0.0,
            float(wrong or 0),
            float(c10d_wrong or 0),
            *ours_us,
            *theirs_us,
        ]
        local = torch.tensor(mine, dtype=torch.float64, device=case.device)
        every = torch.empty(case.nranks * local.numel(), dtype=torch.float64, device=case.device)
        self.comm.all_gather_single(every, local)
        table = every.view(case.nranks, -1).cpu().tolist()
        taking_part = [r for r in range(case.nranks) if table[r][0]]
        per_leg = 1.0 / op.legs
        calls = len(ours_us)

        def timing(first: int, total_wrong: int | None) -> Timing:
            means = [
                sum(table[r][first : first + calls]) / calls * per_leg if r in taking_part else None
                for r in range(case.nranks)
            ]
            return Timing(means, total_wrong)

        total = int(sum(table[r][1] for r in range(case.nranks)))
        result = Pass(form, timing(3, total if wrong is not None else None))
        if compare:
            c10d_total = int(sum(table[r][2] for r in range(case.nranks)))
            result.c10d = timing(3 + calls, c10d_total if c10d_wrong is not None else None)
            # Per call, the slowest rank's time bounds the operation, as for the means.
            ratios = []
            for i in range(calls):
                a = max(table[r][3 + i] for r in taking_part)
                b = max(table[r][3 + calls + i] for r in taking_part)
                if b > 0:  # a clock too coarse to see the call gives no ratio
                    ratios.append(a / b)
            result.ratio = quartiles(ratios) if ratios else None
        elif self.dist is not None:
            result.c10d_note = self.c10d_note(op)
        return result

    def sweep(self, op: BenchOp, forms: tuple[str, ...]) -> Iterator[Row]:
        """Measure ``op`` at every size of the sweep, yielding each row as soon as it is known."""
        case = self.case
        last_count = None
        for nbytes in self.config.sizes:
            count = op.count(nbytes, case)
            # Small sizes can round to the same element count; measure each count once.
            if count == last_count:
                continue
            last_count = count
            calls = self.config.timed_calls(count * case.itemsize)
            passes = [self.measure(op, op.allocate(count, case, form), calls) for form in forms]
            yield Row(
                op=op.name,
                size=count * case.itemsize,
                count=count,
                dtype=dtype_name(case.dtype),
                redop=op.redop_label(case),
                root=op.root_label(case),
                nranks=case.nranks,
                busbw_factor=op.busbw_factor(case.nranks),
                moves_data=op.moves_data,
                passes=passes,
                timed=calls,
                algorithm=passes[0].algorithm if passes else "",
            )


def declared_algorithms(comm: Any) -> frozenset[str]:
    """The operations ``comm``'s backend declares algorithms for (#45)."""
    return frozenset(getattr(type(comm.get_backend_impl()), "algorithms", {}) or {})


def chosen_algorithm(comm: Any, op: str) -> str:
    """The algorithm ``comm``'s backend last chose for ``op`` ("" when it chose none)."""
    try:
        choice = comm.get_backend_impl().tuning.last.get(op)
    except Exception:  # a backend without tuning (duck-typed)
        return ""
    return "" if choice is None else str(choice)


def c10d_description(op: BenchOp, case: Case, dist: Any, c10d_backend: str) -> str:
    """``torch.distributed.<fn> on <backend>``, or ``n/a (<why>)``."""
    refuses = getattr(dist, "refuses", None)  # raw mpi4py (--compare mpi4py)
    note = refuses(op, case) if refuses is not None else op.c10d_refuses(case, c10d_backend)
    if note is not None:
        return f"n/a ({note})"
    if refuses is not None:
        described: str = dist.describe(op)
        return described
    return f"torch.distributed.{op.c10d_function_name(dist)} on {c10d_backend}"


def run_benchmarks(runner: Runner, report: TextReport | None) -> list[Row]:
    """Run every operation of the config; rank 0 passes the report to print to."""
    config, case = runner.config, runner.case
    rows: list[Row] = []
    if report is not None:
        report.start(config, case.nranks)
    ops = available_ops()
    for name in config.ops:
        op = ops[name]
        forms = op.forms_for(config.inplace)
        if report is not None:
            c10d = (
                c10d_description(op, case, runner.dist, runner.c10d_backend)
                if runner.c10d_backend is not None
                else None
            )
            # The algorithm column, for operations the backend chooses an algorithm for.
            report.algorithm_column = name in declared_algorithms(runner.comm)
            report.begin_op(op, config, case.nranks, forms, c10d)
        op_rows = []
        for row in runner.sweep(op, forms):
            op_rows.append(row)
            if report is not None:
                report.row(row)
        if report is not None:
            report.end_op(op_rows)
        rows.extend(op_rows)
    return rows


def _document(
    config: BenchConfig, case: Case, rows: list[Row], started: datetime.datetime
) -> dict[str, Any]:
    functions: dict[str, str | None] = {}
    if config.compare == "mpi4py":
        from torchcomms_core.bench.compare_mpi import MPI_FUNCTIONS

        functions = {name: MPI_FUNCTIONS.get(name) for name in config.ops}
    elif config.compare and not compares_backends(config):
        import torch.distributed as dist

        backend = c10d_backend(config.backend)
        ops = available_ops()
        for name in config.ops:
            op = ops[name]
            functions[name] = (
                None if op.c10d_refuses(case, backend) else op.c10d_function_name(dist)
            )
    return {
        "header": header_dict(config, case.nranks, functions, started),
        "rows": [row_dict(r) for r in rows],
    }


def run_rank(config: BenchConfig) -> int:
    """Benchmark on this process's rank (from the environment); returns the exit status."""
    started = datetime.datetime.now(datetime.timezone.utc)
    rank, nranks, _source = resolve_rank_size()
    validate_config(config, nranks)
    device = resolve_device(config.device, rank)
    timeout = (
        timedelta(seconds=config.timeout_s)
        if config.timeout_s is not None
        else _env.default_timeout()
    )
    comm = new_comm(config.backend, device, name="bench", timeout=timeout)
    case = _case(comm, config)
    dist = None
    second: list[Row] = []
    # With the JSON on standard output, the tables go to standard error.
    out = sys.stderr if config.json_path == "-" else sys.stdout
    try:
        if compares_backends(config):
            pass  # a second pass on the other backend, below
        elif config.compare == "mpi4py":
            from torchcomms_core.bench.compare_mpi import Mpi4pyCalls

            dist = Mpi4pyCalls(case)
        elif config.compare:
            dist = init_c10d(config.backend, rank, nranks, case.device, timeout)
        engine = (
            None
            if dist is None
            else ("mpi4py" if config.compare == "mpi4py" else c10d_backend(config.backend))
        )
        runner = Runner(comm, case, config, dist, engine)
        rows = run_benchmarks(runner, TextReport(out) if rank == 0 else None)
    finally:
        if dist is not None:
            dist.close() if config.compare == "mpi4py" else close_c10d(dist)
        comm.finalize()
    if compares_backends(config):
        second = _second_pass(config, device, timeout, out if rank == 0 else None)
    if rank == 0:
        document = _document(config, case, rows, started)
        if second:
            document["compare_rows"] = [row_dict(r) for r in second]
            print_backend_ratios(config, rows, second, out)
        if config.json_path is not None:
            write_json(document, config.json_path)
        if config.plot_path is not None:
            from torchcomms_core.bench.plot import plot_results

            plot_results(document, config.plot_path)
            print(f"# plot written to {config.plot_path}", file=sys.stderr, flush=True)
    # Every rank saw the same totals, so every rank returns the same status.
    return EXIT_WRONG_RESULTS if any(row.wrong for row in rows + second) else 0


def _case(comm: Any, config: BenchConfig) -> Case:
    """What every operation of the sweep on ``comm`` needs to know of its rank and run."""
    return Case(
        rank=comm.get_rank(),
        nranks=comm.get_size(),
        dtype=DTYPES[config.dtype],
        device=comm.get_device(),
        redop=config.redop,
        root=config.root,
    )


def _second_pass(
    config: BenchConfig, device: torch.device, timeout: timedelta, out: Any
) -> list[Row]:
    """``--compare BACKEND``: the same sweep on the same ranks through the other backend."""
    other = dataclasses.replace(config, backend=str(config.compare), compare=None)
    comm = new_comm(other.backend, device, name="bench-compare", timeout=timeout)
    case = _case(comm, config)
    try:
        return run_benchmarks(
            Runner(comm, case, other, None, None), TextReport(out) if out else None
        )
    finally:
        comm.finalize()


def print_backend_ratios(config: BenchConfig, ours: list[Row], theirs: list[Row], out: Any) -> None:
    """A table of ``--backend`` against ``--compare BACKEND``: busbw and time, per row and form."""
    print(
        f"#\n# {config.backend} / {config.compare}: bus bandwidth ratio (higher: "
        f"{config.backend} faster) and time ratio (lower: {config.backend} faster)",
        file=out,
    )
    print(
        f"# {'op':>22} {'size':>12} {'form':>10} {'busbw ' + config.backend:>14} "
        f"{'busbw ' + str(config.compare):>14} {'busbw x':>8} {'time x':>8}",
        file=out,
    )
    for a, b in zip(ours, theirs, strict=True):
        for pa, pb in zip(a.passes, b.passes, strict=True):
            bus_a, bus_b = a.busbw(pa.ours), b.busbw(pb.ours)
            ratio = f"{bus_a / bus_b:.2f}" if bus_a and bus_b else "N/A"
            time_ratio = pa.ours.time_us / pb.ours.time_us if pb.ours.time_us else float("nan")
            print(
                f"  {a.op:>22} {a.size:>12} {pa.form:>10} "
                f"{'N/A' if bus_a is None else f'{bus_a:.4f}':>14} "
                f"{'N/A' if bus_b is None else f'{bus_b:.4f}':>14} {ratio:>8} "
                f"{time_ratio:>8.2f}",
                file=out,
            )
    out.flush()
