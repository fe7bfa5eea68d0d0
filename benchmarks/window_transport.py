"""A window put + signal through the transport against a gloo send/recv of the same bytes,
interleaved in the same two processes.

Rank 0 puts N bytes into rank 1's window and signals; rank 1 waits for the signal and puts
them back (``TORCHCOMM_WINDOW_TRANSPORT=transport``: the transport path even on one host).
The same two ranks then pass N bytes with gloo ``send``/``recv``. Blocks of both alternate
round by round, so both see the same load, and each row's ratio is the median of the
per-round ratios (window time / send_recv time, per leg). Across network namespaces linked
at ``--link-rate`` (root only) it is the cross-host case:

    python benchmarks/window_transport.py                        # one host, UCX's choice
    python benchmarks/window_transport.py --netns --link-rate 10gbit
    python benchmarks/window_transport.py --sizes 8,1M --rounds 15 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch


def _legs(comm: Any, win: Any, data: torch.Tensor, mode: str, iters: int) -> float:
    """Seconds per leg of ``iters`` round trips (two legs each) of ``mode``."""
    rank = comm.get_rank()
    peer = 1 - rank
    comm.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        if mode == "window":
            if rank == 0:
                win.put(data, peer, 0, False)
                win.signal(peer, False)
                win.wait_signal(peer, False)
            else:
                win.wait_signal(peer, False)
                win.put(data, peer, 0, False)
                win.signal(peer, False)
        elif rank == 0:
            comm.send(data, peer, False)
            comm.recv(data, peer, False)
        else:
            comm.recv(data, peer, False)
            comm.send(data, peer, False)
    return (time.perf_counter() - start) / (2 * iters)


def _rank(sizes: list[int], rounds: int, out: str) -> int:
    import torchcomms

    os.environ["TORCHCOMM_WINDOW_TRANSPORT"] = "transport"
    torch.set_num_threads(1)
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="window-transport")
    rows = []
    for nbytes in sizes:
        numel = max(1, nbytes // 4)
        data = torch.ones(numel)
        win = comm.new_window(torch.zeros(numel))
        iters = max(3, min(200, (8 << 20) // max(nbytes, 1)))
        _legs(comm, win, data, "window", max(2, iters // 4))  # warm: registration, caches
        _legs(comm, win, data, "send_recv", max(2, iters // 4))
        samples: dict[str, list[float]] = {"window": [], "send_recv": []}
        for r in range(rounds):
            order = ("window", "send_recv") if r % 2 == 0 else ("send_recv", "window")
            for mode in order:
                samples[mode].append(_legs(comm, win, data, mode, iters))
        ratios = [w / g for w, g in zip(samples["window"], samples["send_recv"], strict=True)]
        rows.append(
            {
                "bytes": numel * 4,
                "window_us": statistics.median(samples["window"]) * 1e6,
                "send_recv_us": statistics.median(samples["send_recv"]) * 1e6,
                "ratio": statistics.median(ratios),
                "ratio_min": min(ratios),
                "ratio_max": max(ratios),
            }
        )
        comm.barrier()  # the peer's last put has landed
        win.tensor_deregister()
    if comm.get_rank() == 0:
        with open(out, "w") as f:
            json.dump({"rows": rows, "load": os.getloadavg()[0]}, f)
    comm.finalize()
    return 0


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("B")
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="8,4K,64K,1M,16M", help="bytes per leg, comma-separated")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds per size")
    parser.add_argument("--netns", action="store_true", help="ranks in two network namespaces")
    parser.add_argument("--link-rate", default="10gbit", help="their link's rate (with --netns)")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    sizes = [_size(s) for s in args.sizes.split(",")]
    from torchcomms_core.bench import netns
    from torchcomms_core.bench.launch import launch

    out = os.path.join(tempfile.mkdtemp(prefix="window-transport-"), "rows.json")
    where = "one host"
    if args.netns:
        reason = netns.unavailable_reason()
        if reason is not None:
            sys.exit(f"--netns: {reason}")
        with netns.shaped_network(2, args.link_rate) as net:
            where = net.description
            code = netns.launch_in_namespaces(
                net, _rank, (sizes, args.rounds, out), label="window-transport"
            )
    else:
        code = launch(2, _rank, (sizes, args.rounds, out), label="window-transport")
    if code != 0:
        sys.exit(code)
    with open(out) as f:
        result = json.load(f)
    print(f"# window put + signal (transport) against gloo send/recv, 2 ranks, {where}")
    print(f"# {args.rounds} interleaved rounds per size; load {result['load']:.1f}")
    print(f"{'bytes':>10} {'window us':>10} {'send_recv us':>13} {'ratio':>6} {'(min-max)':>12}")
    for row in result["rows"]:
        print(
            f"{row['bytes']:>10} {row['window_us']:>10.1f} {row['send_recv_us']:>13.1f} "
            f"{row['ratio']:>6.2f} {row['ratio_min']:>5.2f}-{row['ratio_max']:.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
