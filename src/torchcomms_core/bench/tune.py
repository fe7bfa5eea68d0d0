"""``torchcomms tune``: measure every declared algorithm on this machine and write the table.

Each rank creates one communicator of the backend whose tuner is the sweep's own
(:class:`SweepTuner`, registered in-process): it answers, for the operation under test, the
candidate being timed, and records the size bucket the backend asked about. For every
operation the backend declares algorithms for and ``torchcomms bench`` can time, every
size of the sweep and every candidate (each algorithm with its default parameters, and
each integer parameter of at least 1 KiB a quarter and four times its default), the
benchmark's own measurement runs (results checked, slowest rank's mean per call). The
fastest candidate whose results were exact wins the size's bucket. Rank 0 writes the table
(:mod:`torchcomms_core.plugin_host.tuning_table`) and prints it.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from datetime import timedelta
from typing import Any, ClassVar

from torchcomms_core.bench.data import OUT_OF_PLACE
from torchcomms_core.bench.ops import available_ops
from torchcomms_core.bench.runner import BenchConfig, Runner, _case, resolve_device
from torchcomms_core.comm.create import new_comm
from torchcomms_core.creation.bootstrap import resolve_rank_size
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.version import __version__
from torchcomms_core.plugin_host.backends import backend_version
from torchcomms_core.plugin_host.tuners import register_tuner
from torchcomms_core.plugin_host.tuning_table import FORMAT, table_path, write_table
from torchcomms_core.spec.tuning import Choice, OpAlgorithms, Query, Tuner

__all__ = ["SWEEP_TUNER", "SweepTuner", "TuneConfig", "candidates", "tune_rank"]

#: The name the sweep's tuner is registered under in the ranks.
SWEEP_TUNER = "torchcomms-tune"


@dataclasses.dataclass(frozen=True)
class TuneConfig:
    """What one ``torchcomms tune`` run measures; identical on every rank."""

    backend: str
    device: str = "cpu"
    ops: tuple[str, ...] | None = None
    minbytes: int = 8
    maxbytes: int = 64 << 20
    stepfactor: int = 4
    iters: int = 10
    warmup: int = 3
    dtype: str = "float32"
    directory: str | None = None
    timeout_s: float | None = None


class SweepTuner(Tuner):
    """Answers the candidate under test for one operation; records what it was asked."""

    #: ``(operation, candidate)`` being timed, or ``None``.
    testing: ClassVar[tuple[str, Choice] | None] = None
    #: The first size bucket asked for the operation under test since the last reset.
    asked: ClassVar[int | None] = None

    def choose(self, query: Query) -> Choice | None:
        """The candidate under test for its operation; ``None`` for the others."""
        testing = SweepTuner.testing
        if testing is None or query.op != testing[0]:
            return None
        if SweepTuner.asked is None:
            SweepTuner.asked = query.nbytes
        return testing[1]

    def fingerprint(self) -> str:
        """The same on every rank of a sweep."""
        return "sweep"


def candidates(spec: OpAlgorithms) -> list[Choice]:
    """Each algorithm with its defaults, and each integer parameter of at least 1 KiB at a
    quarter and at four times its default."""
    out: list[Choice] = []
    for algorithm in spec.algorithms:
        base = dict(algorithm.params)
        out.append(Choice(algorithm.name, base))
        for key, value in base.items():
            if type(value) is int and value >= 1024:
                for scaled in (value // 4, value * 4):
                    out.append(Choice(algorithm.name, {**base, key: scaled}))
    return out


def _say(text: str) -> None:
    print(text, file=sys.stdout, flush=True)


def tune_rank(config: TuneConfig) -> int:
    """Sweep on this process's rank (from the environment); rank 0 writes the table."""
    register_tuner(SWEEP_TUNER, SweepTuner)
    rank, nranks, _source = resolve_rank_size()
    device = resolve_device(config.device, rank)
    timeout = timedelta(seconds=config.timeout_s) if config.timeout_s else _env.default_timeout()
    comm = new_comm(
        config.backend, device, name="tune", timeout=timeout, hints={"tuner": SWEEP_TUNER}
    )
    try:
        rules, skipped = _sweep(comm, config, rank)
        backend = comm.get_backend_impl()
        per_host = backend.tuning.query("", 1, _dtype(config)).ranks_per_host
        version = backend_version(type(backend))
    finally:
        comm.finalize()
    if rank != 0:
        return 0
    table: dict[str, Any] = {
        "format": FORMAT,
        "host": _env.host_id(),
        "backend": config.backend,
        "version": version,
        "world_size": nranks,
        "ranks_per_host": per_host,
        "written_by": f"torchcomms tune (torchcomms-core {__version__})",
        "units": "measured: microseconds per call, slowest rank's mean, by candidate",
        "rules": rules,
    }
    path = table_path(config.backend, nranks, config.directory)
    write_table(path, table)
    for line in skipped:
        _say(f"# not swept: {line}")
    _say(f"# tuning table written to {path} ({len(rules)} rules)")
    return 0


def _dtype(config: TuneConfig) -> Any:
    from torchcomms_core.bench.ops import DTYPES

    return DTYPES[config.dtype]


def _sweep(comm: Any, config: TuneConfig, rank: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Every rule of the table (rank 0's view; every rank measures the same)."""
    backend = comm.get_backend_impl()
    tuning = backend.tuning
    tuner = tuning.tuner
    declared: dict[str, OpAlgorithms] = dict(type(backend).algorithms)
    bench = BenchConfig(
        backend=config.backend,
        device=config.device,
        ops=(),
        minbytes=config.minbytes,
        maxbytes=config.maxbytes,
        stepfactor=config.stepfactor,
        iters=config.iters,
        warmup=config.warmup,
        dtype=config.dtype,
        check=1,
        inplace="0",
    )
    case = _case(comm, bench)
    runner = Runner(comm, case, bench)
    ops = available_ops()
    wanted = config.ops or tuple(declared)
    rules: list[dict[str, Any]] = []
    skipped: list[str] = []
    for name in wanted:
        spec = declared.get(name)
        op = ops.get(name)
        if spec is None or op is None:
            why = "the backend declares no algorithms for it" if spec is None else "no benchmark"
            skipped.append(f"{name} ({why})")
            continue
        refusal = op.refuses(case.dtype, bench.redop, case.nranks)
        if refusal is not None:
            skipped.append(f"{name} ({refusal})")
            continue
        rules.extend(_sweep_op(runner, op, name, spec, bench, tuning, tuner, rank))
    SweepTuner.testing = None
    return rules, skipped


def _sweep_op(
    runner: Runner,
    op: Any,
    name: str,
    spec: OpAlgorithms,
    bench: BenchConfig,
    tuning: Any,
    tuner: Any,
    rank: int,
) -> list[dict[str, Any]]:
    case = runner.case
    rules: list[dict[str, Any]] = []
    last_count = None
    lower = 0
    for nbytes in bench.sizes:
        count = op.count(nbytes, case)
        if count == last_count:
            continue
        last_count = count
        bufs = op.allocate(count, case, OUT_OF_PLACE if OUT_OF_PLACE in op.forms else op.forms[0])
        measured: dict[str, float] = {}
        bucket = None
        for candidate in candidates(spec):
            SweepTuner.testing = (name, candidate)
            SweepTuner.asked = None
            tuning.use(tuner, "the sweep")  # forget earlier answers
            result = runner.measure(op, bufs)
            bucket = SweepTuner.asked if SweepTuner.asked is not None else bucket
            wrong = result.ours.wrong
            measured[str(candidate)] = math.inf if wrong else round(result.ours.time_us, 2)
        best = min(measured, key=lambda k: measured[k])
        if bucket is None or math.isinf(measured[best]):
            # The backend never asked (the choice does not matter here), or no candidate
            # gave exact results: no rule, the default rule keeps deciding.
            continue
        choice = next(c for c in candidates(spec) if str(c) == best)
        rule = {
            "op": name,
            "min_bytes": lower,
            "max_bytes": bucket,
            "algorithm": choice.algorithm,
            "params": dict(choice.params),
            "measured": {k: (None if math.isinf(v) else v) for k, v in measured.items()},
        }
        lower = bucket + 1
        rules.append(rule)
        if rank == 0:
            shown = ", ".join(f"{k} {v}" for k, v in measured.items())
            _say(f"{name:>22} {bucket:>10} B  best {best:<28} ({shown})")
    return rules
