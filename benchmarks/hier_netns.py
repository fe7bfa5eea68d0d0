"""``hier`` (exact, and with ``global_codec=int8``) against flat gloo on emulated hosts.

H network namespaces of K ranks each, joined by links shaped to ``--link-rate`` each way
(as ``torchcomms bench --netns H --ranks-per-host K``). Every path lives on the same ranks
at once and the timed calls alternate between them (``hier``, ``hier int8``, ``gloo``, then
the reverse order), so a change of load falls on every path alike. Per path it prints the
slowest rank's mean and median time per call, busbw (``2 (n-1)/n * bytes / time``, the
float32 tensor's bytes for every path) and its ratio to flat gloo's, and the bounds of an
exact all_reduce over the link: ``1.5 * link`` for 2 hosts of 2 ranks, ``(n-1)/n *
H/(H-1) * link`` in general (each host's link carries ``2 (H-1)/H`` of the message each
way). Results are checked: the exact paths for equality (the inputs are small integers,
whose float32 sums are exact), ``hier int8`` element by element against
:func:`torchcomms_hier.global_codec_error_bound`, and for the same bits on every rank.

Needs root, ``ip`` and ``tc``::

    python benchmarks/hier_netns.py --hosts 2 --ranks-per-host 2 --bytes 64M --calls 5
    python benchmarks/hier_netns.py --hosts 8 --ranks-per-host 1 --bytes 8 --calls 300 \\
        --paths hier,gloo
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from datetime import timedelta

import torch

#: Every path the script can time, in the order of even calls.
PATHS = ("hier", "hier int8", "gloo")
_SIZES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    """``64M``, ``8``, ``4K``: a byte count (a multiple of 4, float32 elements)."""
    unit = text[-1:].upper() if text[-1:].isalpha() else ""
    value = int(text[: -1 if unit else None]) * _SIZES[unit]
    if value < 4 or value % 4:
        raise argparse.ArgumentTypeError(f"--bytes {text}: give a multiple of 4 bytes, >= 4")
    return value


def _inputs(rank: int, count: int, codec: bool) -> torch.Tensor:
    """Rank ``rank``'s input: small integers (exact float32 sums), or for the int8 path
    normal values whose magnitude changes from block to block."""
    if not codec:
        return ((torch.arange(count) + 7 * rank) % 13).to(torch.float32)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(count, generator=gen)
    scale = torch.logspace(-3, 3, steps=64).repeat(-(-count // (64 * 256)) + 1)
    return x * scale.repeat_interleave(256)[:count]


def _writes() -> int:
    """Write system calls this process has made (``syscw`` of ``/proc/self/io``; 0 where
    that is not readable). Gloo writes each message with one call, so the count per
    all_reduce is the messages a rank sends, a figure that does not depend on the machine."""
    try:
        with open("/proc/self/io", encoding="ascii") as io:
            for line in io:
                if line.startswith("syscw:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rank_main(
    paths: list[str], nbytes: int, calls: int, warmup: int, algorithm: str = "auto"
) -> int:
    """On one rank: build the communicators, time the paths alternately, check, report."""
    import torchcomms
    from torchcomms import ReduceOp
    from torchcomms_hier import global_codec_error_bound

    timeout = timedelta(seconds=300)
    flat = torchcomms.new_comm("gloo", "cpu", name="flat", timeout=timeout)
    forced = {"hier::all_reduce_algorithm": algorithm}
    comms = {
        "hier": lambda: torchcomms.new_comm(
            "hier", "cpu", name="hier", timeout=timeout, hints=forced
        ),
        "hier int8": lambda: torchcomms.new_comm(
            "hier", "cpu", name="hier8", timeout=timeout, hints={"global_codec": "int8", **forced}
        ),
        "gloo": lambda: flat,
    }
    made = {path: comms[path]() for path in paths}
    rank, n = flat.get_rank(), flat.get_size()
    count = nbytes // 4
    sources = {path: _inputs(rank, count, path == "hier int8") for path in paths}
    tensors = {path: sources[path].clone() for path in paths}
    op = ReduceOp.SUM
    wall: dict[str, list[float]] = {path: [] for path in paths}
    cpu: dict[str, float] = {path: 0.0 for path in paths}
    sends: dict[str, int] = {path: 0 for path in paths}
    for i in range(warmup + calls):
        for path in paths if i % 2 == 0 else paths[::-1]:
            t = tensors[path]
            t.copy_(sources[path])  # in place: every call starts from the inputs
            flat.barrier()
            w0 = _writes()
            c0, t0 = time.process_time(), time.perf_counter()
            made[path].all_reduce(t, op)
            elapsed = time.perf_counter() - t0
            if i >= warmup:
                wall[path].append(elapsed)
                cpu[path] += time.process_time() - c0
                sends[path] += _writes() - w0
    # Checks, after the timing.
    checks: dict[str, str] = {}
    for path in paths:
        result = tensors[path]
        digest = hashlib.sha256(result.numpy().tobytes()).hexdigest()
        made_list = [torch.empty(32, dtype=torch.uint8) for _ in range(n)]
        flat.all_gather(made_list, torch.frombuffer(bytearray.fromhex(digest), dtype=torch.uint8))
        digests = [bytes(d.tolist()).hex() for d in made_list]
        same = all(d == digests[0] for d in digests)
        if path == "hier int8":
            if rank == 0:
                every = [_inputs(r, count, True) for r in range(n)]
                bound = global_codec_error_bound(every, op)
                exact = torch.zeros(count, dtype=torch.float64)
                for x in every:
                    exact += x.double()
                error = (result.double() - exact).abs()
                outside = int((~(error <= bound)).sum())
                rel = float((error / bound.clamp_min(1e-300)).max())
                checks[path] = (
                    f"{outside} outside the bound (largest error / bound {rel:.3f}), "
                    f"same bits on every rank: {same}"
                )
        else:
            expected = torch.zeros(count, dtype=torch.float64)
            for r in range(n):
                expected += _inputs(r, count, False).double()
            wrong = int((result.double() != expected).sum())
            checks[path] = f"{wrong} wrong, same bits on every rank: {same}"
    mine = torch.tensor(
        [
            [
                statistics.fmean(wall[p]),
                statistics.median(wall[p]),
                cpu[p] / calls,
                sends[p] / calls,
            ]
            for p in paths
        ],
        dtype=torch.float64,
    )
    every_rank = [torch.empty_like(mine) for _ in range(n)]
    flat.all_gather(every_rank, mine)
    if rank == 0:
        stacked = torch.stack(every_rank)
        slowest = stacked.max(dim=0).values
        slowest[:, 2:] = stacked[:, :, 2:].mean(dim=0)  # CPU and sends: the mean over ranks
        _report(paths, slowest, checks, nbytes, n, calls)
    for path, comm in made.items():
        if path != "gloo":
            comm.finalize()
    flat.finalize()
    return 0


_LINK: dict[str, float] = {}


def _report(
    paths: list[str], slowest: torch.Tensor, checks: dict[str, str], nbytes: int, n: int, calls: int
) -> None:
    link = _LINK["gbps"]
    hosts = _LINK["hosts"]
    factor = 2 * (n - 1) / n
    print(f"# {nbytes} bytes, {n} ranks on {hosts:.0f} hosts, link {link:.4f} GB/s each way")
    print(
        f"# {calls} calls per path; slowest rank's mean and median; cpu: CPU time per call "
        "of one rank (every thread, user and system), the mean over ranks; sends: messages "
        "one rank writes per call (write system calls), the mean over ranks"
    )
    if hosts > 1:
        bound = (n - 1) / n * hosts / (hosts - 1) * link
        print(f"# exact all_reduce bound over the link: {bound:.4f} GB/s busbw")
    base = None
    if "gloo" in paths:
        base = float(slowest[paths.index("gloo"), 0])
    header = (
        f"{'path':<10} {'mean':>12} {'median':>12} {'cpu':>10} {'sends':>6} {'busbw GB/s':>11} "
        f"{'vs gloo':>8}"
    )
    print(header + ("  vs bound" if hosts > 1 else ""))
    for k, path in enumerate(paths):
        mean, median, cpu, sent = (float(x) for x in slowest[k])
        busbw = factor * nbytes / mean / 1e9
        ratio = f"{base / mean:>7.2f}x" if base else ""
        line = (
            f"{path:<10} {mean * 1e6:>10.0f}us {median * 1e6:>10.0f}us {cpu * 1e6:>8.0f}us "
            f"{sent:>6.1f} {busbw:>11.4f} {ratio:>8}"
        )
        if hosts > 1:
            line += f"  {busbw / ((n - 1) / n * hosts / (hosts - 1) * link):>7.2f}"
        print(line)
    for path, text in checks.items():
        print(f"# {path}: {text}")


def _rank_entry(
    paths: list[str], nbytes: int, calls: int, warmup: int, link: dict[str, float], algorithm: str
) -> int:
    _LINK.update(link)
    return rank_main(paths, nbytes, calls, warmup, algorithm)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2, help="namespaces (hosts), 1 to 8")
    parser.add_argument("--ranks-per-host", type=int, default=2)
    parser.add_argument("--bytes", type=parse_bytes, default=parse_bytes("64M"))
    parser.add_argument("--calls", type=int, default=5, help="timed calls per path")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per path first")
    parser.add_argument("--paths", default=",".join(PATHS), help=f"of {', '.join(PATHS)}")
    parser.add_argument("--link-rate", default="1gbit", help="rate of each host's link")
    parser.add_argument(
        "--algorithm",
        default="auto",
        help="hier's all_reduce algorithm (hint hier::all_reduce_algorithm): auto (the size "
        "rule), flat, recursive_doubling, levels or pipelined",
    )
    args = parser.parse_args()
    paths = [p.strip().replace("-", " ") for p in args.paths.split(",") if p.strip()]
    unknown = [p for p in paths if p not in PATHS]
    if unknown:
        parser.error(f"--paths: unknown {unknown}; choose among {', '.join(PATHS)}")
    if not 1 <= args.hosts <= 8:
        parser.error("--hosts: 1 to 8")
    from torchcomms_core.bench.netns import launch_in_namespaces, parse_rate, shaped_network

    link = {"gbps": parse_rate(args.link_rate) / 8 / 1e9, "hosts": float(args.hosts)}
    with shaped_network(args.hosts, args.link_rate, ranks_per_host=args.ranks_per_host) as net:
        return launch_in_namespaces(
            net,
            _rank_entry,
            (paths, args.bytes, args.calls, args.warmup, link, args.algorithm),
            label="hier_netns",
        )


if __name__ == "__main__":
    sys.exit(main())
