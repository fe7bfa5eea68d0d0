"""Measure collective bandwidth and check results, printing what nccl-tests prints.

Launches --nproc local ranks itself, or runs in place when started by a launcher such as
torchrun, mpiexec or srun (their rank variables set).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from torchcomms_core.bench.compare import COMPARE_WITH
from torchcomms_core.bench.launch import launch
from torchcomms_core.bench.ops import DEFAULT_OPS, DTYPES, REDOPS, unknown_ops_message
from torchcomms_core.bench.runner import (
    INPLACE_CHOICES,
    BenchConfig,
    run_rank,
    runnable_ops,
    validate_config,
)
from torchcomms_core.bench.sizes import DEFAULT_ITERS, SMALL_MIN_CALLS, parse_size
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import TorchCommError

HELP = "benchmark collectives (bandwidth and correctness, nccl-tests style)"

DEFAULT_NPROC = 4
#: ``--ops`` value that selects every operation that can run with the other options.
ALL_OPS = "all"


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
    if ALL_OPS in names:
        if len(names) > 1:
            raise argparse.ArgumentTypeError(
                f"{ALL_OPS!r} already names every operation; do not combine it with others"
            )
        return names
    problem = unknown_ops_message(names)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return names


class _PluginOpsHelp(str):
    """A help text naming the installed plugin collectives' benchmarks, found only when
    the help is shown (so other commands do not load the plugins)."""

    __slots__ = ()

    def __mod__(self, params: Any) -> str:
        from torchcomms_core.bench.ops import plugin_ops

        names = ", ".join(plugin_ops()) or "none installed"
        return str.__mod__(str(self).replace("%s", names.replace("%", "%%")), params)


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
    parser.add_argument(
        "--backend",
        default="gloo",
        help="torchcomms backend to benchmark; `torchcomms backends` lists "
        "them (default: %(default)s)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="device type; accelerators get the index of the local rank (default: %(default)s)",
    )
    parser.add_argument(
        "--nproc",
        type=_int_at_least(1),
        default=None,
        help=f"local ranks to launch (default {DEFAULT_NPROC}); under a launcher "
        f"such as torchrun, mpiexec or srun the launcher's ranks are used "
        f"instead",
    )
    parser.add_argument(
        "-b",
        "--minbytes",
        type=_size,
        default="8",
        help="smallest size in bytes; K, M, G are powers of 1024 (default: %(default)s)",
    )
    parser.add_argument(
        "-e", "--maxbytes", type=_size, default="64M", help="largest size (default: %(default)s)"
    )
    parser.add_argument(
        "-f",
        "--stepfactor",
        type=_int_at_least(2),
        default=2,
        help="multiply the size by this between rows (default: %(default)s)",
    )
    parser.add_argument(
        "-n",
        "--iters",
        type=_int_at_least(1),
        default=None,
        help="timed iterations per size (default: 20, and 200 below 64K, where one late "
        "call would set the mean)",
    )
    parser.add_argument(
        "-w",
        "--warmup_iters",
        type=_int_at_least(0),
        default=5,
        help="untimed iterations before timing (default: %(default)s)",
    )
    parser.add_argument(
        "-d",
        "--datatype",
        choices=list(DTYPES),
        default="float32",
        metavar="DTYPE",
        help=f"element type: {', '.join(DTYPES)} (default: %(default)s)",
    )
    parser.add_argument(
        "-o",
        "--op",
        choices=list(REDOPS),
        default="sum",
        metavar="REDOP",
        help=f"reduction of reducing collectives: {', '.join(REDOPS)} (default: %(default)s)",
    )
    parser.add_argument(
        "-r",
        "--root",
        type=_int_at_least(0),
        default=0,
        help="root rank of rooted collectives (default: %(default)s)",
    )
    parser.add_argument(
        "--ops",
        type=_op_list,
        default=",".join(DEFAULT_OPS),
        help=_PluginOpsHelp(
            f"comma-separated operations to run, or {ALL_OPS!r} for every "
            f"collective of the API and the installed plugin collectives "
            f"(%s) that can run with the other options "
            f"(default: {', '.join(DEFAULT_OPS)})"
        ),
    )
    parser.add_argument(
        "--inplace",
        choices=INPLACE_CHOICES,
        default="both",
        help="for operations with both layouts, time out-of-place (0), in-place "
        "(1) or both, each in its own pass; the others run the layout they "
        "have (default: %(default)s)",
    )
    parser.add_argument(
        "-c",
        "--check",
        type=int,
        choices=(0, 1),
        default=1,
        help="check every result against the exact expected values; "
        "approximate plugin collectives (quantized) against their documented error bound "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--compare",
        default=None,
        metavar="{" + ",".join(COMPARE_WITH) + ",BACKEND}",
        help="also run each operation through raw torch.distributed (c10d) on "
        "the same engine and tensors, or raw mpi4py calls (mpi4py, with "
        "--backend mpi), interleaved call by call, and print the time "
        "ratio ours/theirs; or name another torchcomms backend (e.g. --backend hier "
        "--compare gloo) to run the same sweep through it on the same ranks afterwards "
        "and print both, with a table of busbw and time ratios",
    )
    parser.add_argument(
        "--json",
        metavar="PATH",
        dest="json_path",
        default=None,
        help="write every row with every field, and a header describing the "
        "run, as JSON to PATH ('-': standard output; the tables then go "
        "to standard error)",
    )
    parser.add_argument(
        "--plot",
        metavar="PNG",
        dest="plot_path",
        default=None,
        help="save bus bandwidth against size, per operation, on log axes "
        "(needs matplotlib: pip install 'torchcomms-core[plot]')",
    )
    parser.add_argument(
        "--from-json",
        metavar="JSON",
        nargs="+",
        default=None,
        help="with --plot: plot runs saved by --json instead of running",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="measure what the machine allows instead: memcpy GB/s on one "
        "core, loopback TCP GB/s and round-trip latency",
    )
    parser.add_argument(
        "--timeout",
        type=_seconds,
        default=None,
        help=f"seconds before an operation fails (default: ${_env.TIMEOUT_SECONDS} or 600)",
    )
    parser.add_argument(
        "--netns",
        type=_int_at_least(1),
        default=None,
        metavar="N",
        help="run N ranks as N hosts: one network namespace each, linked to a "
        "bridge by links shaped to --link-rate (needs root, ip and tc)",
    )
    parser.add_argument(
        "--ranks-per-host",
        type=_int_at_least(1),
        default=1,
        metavar="K",
        help="with --netns H: K ranks in each of the H namespaces (H*K ranks); ranks of "
        "one namespace talk without crossing the shaped link, and TORCHCOMM_HOST_ID names "
        "their namespace (the hier backend groups them by it) (default: 1)",
    )
    parser.add_argument(
        "--link-rate",
        default=None,
        metavar="RATE",
        help="with --netns: rate of every link, each way, in tc's units "
        "(profiles 1gbit, 10gbit; e.g. 100mbit) (default: 1gbit)",
    )


def _check_writable(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    if path is None or path == "-":
        return
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        parser.error(f"{option} {path}: folder {folder} does not exist")


def _probe(args: argparse.Namespace) -> int:
    from torchcomms_core.bench.probe import print_probe, run_probe
    from torchcomms_core.bench.results import write_json

    result = run_probe()
    print_probe(result, sys.stderr if args.json_path == "-" else sys.stdout)
    if args.json_path is not None:
        write_json({"probe": result.as_dict()}, args.json_path)
    return 0


def _replot(args: argparse.Namespace) -> int:
    from torchcomms_core.bench.plot import plot_results

    parser: argparse.ArgumentParser = args.parser
    documents = []
    for path in args.from_json:
        try:
            with open(path, encoding="utf-8") as f:
                document = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            parser.error(f"--from-json {path}: {exc}")
        if not isinstance(document, dict) or "header" not in document or "rows" not in document:
            parser.error(f"--from-json {path}: not a file written by torchcomms bench --json")
        documents.append(document)
    try:
        plot_results(documents, args.plot_path)
    except ValueError as exc:
        parser.error(str(exc))
    print(f"# plot written to {args.plot_path}", file=sys.stderr)
    return 0


def _netns_network(
    parser: argparse.ArgumentParser, args: argparse.Namespace, launched: tuple[int, int, str] | None
) -> Any:
    """The shaped network ``--netns`` asks for (not built yet), or ``None``."""
    if args.netns is None:
        if args.link_rate is not None:
            parser.error("--link-rate shapes the links of --netns; give --netns N too")
        if args.ranks_per_host != 1:
            parser.error(
                "--ranks-per-host places ranks in the namespaces of --netns; give --netns N too"
            )
        return None
    from torchcomms_core.bench import netns

    if launched is not None:
        parser.error(
            f"--netns starts its own ranks, one per namespace; run it directly, not "
            f"under {launched[2]}"
        )
    nranks = args.netns * args.ranks_per_host
    if args.nproc is not None and args.nproc != nranks:
        parser.error(
            f"--netns {args.netns} with --ranks-per-host {args.ranks_per_host} runs {nranks} "
            f"ranks; drop --nproc {args.nproc} or make it equal"
        )
    reason = netns.unavailable_reason()
    if reason is not None:
        parser.error(f"--netns: {reason}")
    try:
        rate = netns.parse_rate(args.link_rate or "1gbit")
    except ValueError as exc:
        parser.error(f"--link-rate: {exc}")
    return netns.Network(f"{netns.PREFIX}{os.getpid()}", args.netns, rate, args.ranks_per_host)


def _run_in_namespaces(parser: argparse.ArgumentParser, network: Any, config: BenchConfig) -> int:
    from torchcomms_core.bench import netns

    try:
        with netns.shaped_network(network.size, network.rate_bits, network.ranks_per_host) as net:
            return netns.launch_in_namespaces(net, run_rank, (config,), label=parser.prog)
    except netns.NetnsError as exc:
        print(f"{parser.prog}: --netns: {exc}", file=sys.stderr)
        return 1


def run(args: argparse.Namespace) -> int:
    """Validate the options, then launch the ranks or run as this launcher-started rank."""
    parser: argparse.ArgumentParser = args.parser
    _check_writable(parser, "--json", args.json_path)
    _check_writable(parser, "--plot", args.plot_path)
    if args.plot_path is not None:
        from torchcomms_core.bench.plot import require_matplotlib

        try:
            require_matplotlib()
        except ValueError as exc:
            parser.error(str(exc))
    if args.probe:
        return _probe(args)
    if args.from_json is not None:
        if args.plot_path is None:
            parser.error("--from-json plots saved runs: give --plot PNG too")
        return _replot(args)

    try:
        launched = _env.rank_and_size()
    except ValueError as exc:
        parser.error(str(exc))
    network = _netns_network(parser, args, launched)
    nranks = (
        launched[1]
        if launched
        else (args.netns * args.ranks_per_host if args.netns else (args.nproc or DEFAULT_NPROC))
    )
    config = BenchConfig(
        backend=args.backend,
        device=args.device,
        ops=args.ops,
        minbytes=args.minbytes,
        maxbytes=args.maxbytes,
        stepfactor=args.stepfactor,
        iters=DEFAULT_ITERS if args.iters is None else args.iters,
        small_iters=SMALL_MIN_CALLS if args.iters is None else args.iters,
        warmup=args.warmup_iters,
        dtype=args.datatype,
        redop=args.op,
        root=args.root,
        check=args.check,
        timeout_s=args.timeout,
        inplace=args.inplace,
        compare=args.compare,
        json_path=args.json_path,
        plot_path=args.plot_path,
        network=network.description if network is not None else None,
    )
    quiet = launched is not None and launched[0] != 0
    if config.ops == (ALL_OPS,):
        names, skipped = runnable_ops(config, nranks)
        if not quiet:
            for line in skipped:
                print(f"{parser.prog}: --ops all skips {line}", file=sys.stderr)
        config = dataclasses.replace(config, ops=tuple(names))
    try:
        validate_config(config, nranks)
    except (ValueError, TorchCommError) as exc:
        parser.error(str(exc))

    if network is not None:
        return _run_in_namespaces(parser, network, config)
    if launched is None:
        from torchcomms_core.plugin_host.backends import get_backend_class

        if get_backend_class(config.backend).launcher == "mpiexec":
            from torchcomms_core.bench.mpiexec import relaunch_under_mpiexec

            return relaunch_under_mpiexec(nranks, label=parser.prog)
        return launch(nranks, run_rank, (config,), label=parser.prog)
    rank, size, source = launched
    if args.nproc is not None and args.nproc != size and rank == 0:
        print(
            f"{parser.prog}: running the {size} ranks started by {source}; --nproc "
            f"{args.nproc} is ignored",
            file=sys.stderr,
        )
    try:
        return run_rank(config)
    except TorchCommError as exc:
        print(f"{parser.prog}: rank {rank}: {exc}", file=sys.stderr)
        return 1
