"""Measure collective bandwidth and check results, printing what nccl-tests prints.

Launches --nproc local ranks itself, or runs in place when started by a launcher such as
torchrun (RANK and WORLD_SIZE set).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from .. import _env
from ..bench.launch import launch
from ..bench.ops import DTYPES, OPS, PLUGIN_OPS, REDOPS, unknown_ops_message
from ..bench.runner import BenchConfig, run_rank, validate_config
from ..bench.sizes import parse_size
from ..errors import TorchCommError

HELP = "benchmark collectives (bandwidth and correctness, nccl-tests style)"

DEFAULT_NPROC = 4


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def _op_list(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    problem = unknown_ops_message(names)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return names


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options of ``torchcomms bench`` (nccl-tests' short flags where it has one)."""
    parser.add_argument("--backend", default="gloo",
                        help="torchcomms backend to benchmark (default: %(default)s)")
    parser.add_argument("--device", default="cpu",
                        help="device type; accelerators get the index of the local rank "
                             "(default: %(default)s)")
    parser.add_argument("--nproc", type=_int_at_least(1), default=None,
                        help=f"local ranks to launch (default {DEFAULT_NPROC}); under a launcher "
                             f"such as torchrun the launcher's ranks are used instead")
    parser.add_argument("-b", "--minbytes", type=_size, default="8",
                        help="smallest size in bytes; K, M, G are powers of 1024 "
                             "(default: %(default)s)")
    parser.add_argument("-e", "--maxbytes", type=_size, default="64M",
                        help="largest size (default: %(default)s)")
    parser.add_argument("-f", "--stepfactor", type=_int_at_least(2), default=2,
                        help="multiply the size by this between rows (default: %(default)s)")
    parser.add_argument("-n", "--iters", type=_int_at_least(1), default=20,
                        help="timed iterations per size (default: %(default)s)")
    parser.add_argument("-w", "--warmup_iters", type=_int_at_least(0), default=5,
                        help="untimed iterations before timing (default: %(default)s)")
    parser.add_argument("-d", "--datatype", choices=list(DTYPES), default="float32",
                        metavar="DTYPE",
                        help=f"element type: {', '.join(DTYPES)} (default: %(default)s)")
    parser.add_argument("-o", "--op", choices=list(REDOPS), default="sum", metavar="REDOP",
                        help=f"reduction of reducing collectives: {', '.join(REDOPS)} "
                             f"(default: %(default)s)")
    parser.add_argument("-r", "--root", type=_int_at_least(0), default=0,
                        help="root rank of rooted collectives (default: %(default)s)")
    parser.add_argument("--ops", type=_op_list, default=",".join(OPS),
                        help=f"comma-separated operations to run, from {', '.join(OPS)}, and "
                             f"plugin collectives when installed ({', '.join(PLUGIN_OPS)}) "
                             f"(default: every built-in one)")
    parser.add_argument("-c", "--check", type=int, choices=(0, 1), default=1,
                        help="check every result against the exact expected values; "
                             "quantized collectives against their documented error bound "
                             "(default: %(default)s)")
    parser.add_argument("--timeout", type=_seconds, default=None,
                        help=f"seconds before an operation fails (default: "
                             f"${_env.TIMEOUT_SECONDS} or 600)")


def run(args: argparse.Namespace) -> int:
    """Validate the options, then launch the ranks or run as this launcher-started rank."""
    parser: argparse.ArgumentParser = args.parser
    config = BenchConfig(
        backend=args.backend, device=args.device, ops=args.ops, minbytes=args.minbytes,
        maxbytes=args.maxbytes, stepfactor=args.stepfactor, iters=args.iters,
        warmup=args.warmup_iters, dtype=args.datatype, redop=args.op, root=args.root,
        check=args.check, timeout_s=args.timeout,
    )
    try:
        launched = _env.rank_and_size()
    except ValueError as exc:
        parser.error(str(exc))
    nranks = launched[1] if launched else (args.nproc or DEFAULT_NPROC)
    try:
        validate_config(config, nranks)
    except (ValueError, TorchCommError) as exc:
        parser.error(str(exc))

    if launched is None:
        return launch(nranks, run_rank, (config,), label=parser.prog)
    rank, size, source = launched
    if args.nproc is not None and args.nproc != size and rank == 0:
        print(f"{parser.prog}: running the {size} ranks started by {source}; --nproc "
              f"{args.nproc} is ignored", file=sys.stderr)
    try:
        return run_rank(config)
    except TorchCommError as exc:
        print(f"{parser.prog}: rank {rank}: {exc}", file=sys.stderr)
        return 1
