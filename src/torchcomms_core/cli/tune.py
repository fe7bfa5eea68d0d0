"""Measure a backend's declared algorithms on this machine and write its tuning table.

``torchcomms tune --backend shm --nproc 4`` launches the ranks, times every algorithm
(and parameter variants) the backend declares over a sweep of sizes with the benchmark's
own measurement (results checked), and writes the fastest per size bucket to
``$TORCHCOMM_TUNING_DIR/<backend>-np<N>.json`` (default ``~/.cache/torchcomms/tuning``).
Later communicators of that backend and world size on this host use it (the built-in tuner
``table``); the file is JSON meant to be read and edited by hand (docs/writing-a-tuner.md).
"""

from __future__ import annotations

import argparse
import dataclasses

from torchcomms_core.cli.bench import _int_at_least, _size

HELP = "measure a backend's algorithms on this machine and write its tuning table"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", required=True, help="the backend to tune (e.g. shm)")
    parser.add_argument("--nproc", type=_int_at_least(1), default=4, help="local ranks (4)")
    parser.add_argument("--device", default="cpu", help="device type (default: %(default)s)")
    parser.add_argument(
        "--ops",
        default=None,
        help="comma-separated operations to sweep (default: every one the backend declares "
        "algorithms for and the benchmark can time)",
    )
    parser.add_argument("-b", "--minbytes", type=_size, default="8", help="smallest size (8)")
    parser.add_argument("-e", "--maxbytes", type=_size, default="64M", help="largest size (64M)")
    parser.add_argument(
        "-f", "--stepfactor", type=_int_at_least(2), default=4, help="size factor (4)"
    )
    parser.add_argument("-n", "--iters", type=_int_at_least(1), default=10, help="timed calls")
    parser.add_argument("-w", "--warmup-iters", type=_int_at_least(0), default=3)
    parser.add_argument(
        "--dir",
        default=None,
        help="where to write the table (default: $TORCHCOMM_TUNING_DIR, else "
        "~/.cache/torchcomms/tuning)",
    )
    parser.add_argument("--timeout", type=float, default=None, help="seconds per operation")


def run(args: argparse.Namespace) -> int:
    from torchcomms_core.bench.launch import launch
    from torchcomms_core.bench.tune import TuneConfig, tune_rank
    from torchcomms_core.foundation.errors import TorchCommError
    from torchcomms_core.plugin_host.backends import get_backend_class

    try:
        cls = get_backend_class(args.backend)
    except TorchCommError as exc:
        args.parser.error(str(exc))
    if not cls.algorithms:
        args.parser.error(
            f"backend {args.backend!r} declares no algorithms, so there is nothing to tune "
            f"(`torchcomms backends --algorithms` lists the backends that do)"
        )
    from torchcomms_core.foundation import env as _env

    try:
        launched = _env.rank_and_size()
    except ValueError as exc:
        args.parser.error(str(exc))
    if launched is None and cls.launcher == "mpiexec":
        args.parser.error(
            f"backend {args.backend!r} runs under mpiexec; tune it with "
            f"`mpiexec -n N torchcomms tune --backend {args.backend}`"
        )
    if args.maxbytes < args.minbytes:
        args.parser.error(f"--maxbytes {args.maxbytes} is below --minbytes {args.minbytes}")
    ops = tuple(o.strip() for o in args.ops.split(",") if o.strip()) if args.ops else None
    config = TuneConfig(
        backend=args.backend,
        device=args.device,
        ops=ops,
        minbytes=args.minbytes,
        maxbytes=args.maxbytes,
        stepfactor=args.stepfactor,
        iters=args.iters,
        warmup=args.warmup_iters,
        directory=args.dir,
        timeout_s=args.timeout,
    )
    if launched is not None:  # started by a launcher (torchrun, mpiexec): run in place
        return tune_rank(config)
    return launch(args.nproc, tune_rank, (dataclasses.replace(config),), label=args.parser.prog)
