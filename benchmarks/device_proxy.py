"""The device-window proxies alone against the host-driven window, on the same backend (#56).

Two ranks. ``host``: rank 0 calls ``window.put`` + ``signal``, rank 1 ``wait_signal``.
``native`` and ``python``: the same puts and signals written into a device window's command
ring by a Python host writer (``CommandRing.push``, the protocol a kernel follows), carried
out by the window's C proxy or its Python proxy (one window each), and awaited by polling
the signal words as a kernel does. Two figures per backend, each the median of rounds that
rotate the three ways:

- bandwidth: ``--iters`` puts of ``--bytes`` (64 MiB) each with a signal, then one signal
  back (so the time covers delivery);
- round trip: an 8-byte put + signal to the peer, which answers the same way.

    python benchmarks/device_proxy.py                     # shm and gloo, 2 ranks
    python benchmarks/device_proxy.py --backends shm --rounds 9 --json out.json

The memcpy bandwidth and the load average at the time are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import torch

from torchcomms_core.device import layout as L
from torchcomms_core.device.ring import Command, CommandRing, words_at
from torchcomms_core.testing import RankPool
from torchcomms_core.testing.pool import unique_name

SIGNAL = 0


class _ProxySide:
    """A rank's host writer on its device window, and the signal words it polls."""

    def __init__(self, win: Any, peer: int, source: int) -> None:
        handle = win.get_device_window(signal_count=1, counter_count=1)
        state = words_at(handle, L.STATE_WORDS)
        self.ring = CommandRing(state)
        size = int(state[L.NRANKS])
        self.signals = words_at(int(state[L.SIGNALS]), size)
        self.peer, self.source = peer, source
        self.seen = 0

    def put(self, nbytes: int) -> None:
        command = Command(L.OP_PUT, self.peer, 0, self.source, 0, nbytes, SIGNAL, -1)
        if self.ring.push(command, 60.0) != L.OK:
            raise RuntimeError("the ring stayed full")

    def signal(self) -> None:
        self.ring.push(Command(L.OP_SIGNAL, self.peer, 0, 0, 0, 0, SIGNAL, 1), 60.0)

    def wait(self, count: int = 1) -> None:
        self.seen += count
        polls = 0
        while self.signals[self.peer] < self.seen:
            # Yield the interpreter lock to this process's proxy thread; past the first
            # polls, nap, as a waiting rank should on a machine with few cores.
            polls += 1
            if polls < 200:
                os.sched_yield()
            else:
                time.sleep(0.00005)


def _bandwidth(
    comm: Any, win: Any, side: _ProxySide, data: torch.Tensor, mode: str, iters: int
) -> float:
    rank, peer = comm.get_rank(), 1 - comm.get_rank()
    comm.barrier(False)
    start = time.perf_counter()
    if mode == "host":
        if rank == 0:
            for _ in range(iters):
                win.put(data, peer, 0, False)
                win.signal(peer, False)
            win.wait_signal(peer, False)
        else:
            for _ in range(iters):
                win.wait_signal(peer, False)
            win.signal(peer, False)
    elif rank == 0:
        for _ in range(iters):
            side.put(data.nbytes)
        side.wait()
    else:
        side.wait(iters)
        side.signal()
    seconds = time.perf_counter() - start
    return iters * data.nbytes / seconds / 1e9


def _round_trip(
    comm: Any, win: Any, side: _ProxySide, data: torch.Tensor, mode: str, iters: int
) -> float:
    rank, peer = comm.get_rank(), 1 - comm.get_rank()
    comm.barrier(False)
    start = time.perf_counter()
    for _ in range(iters):
        if mode == "host":
            if rank == 0:
                win.put(data, peer, 0, False)
                win.signal(peer, False)
                win.wait_signal(peer, False)
            else:
                win.wait_signal(peer, False)
                win.put(data, peer, 0, False)
                win.signal(peer, False)
        elif rank == 0:
            side.put(data.nbytes)
            side.wait()
        else:
            side.wait()
            side.put(data.nbytes)
    return (time.perf_counter() - start) / iters * 1e6


MODES = ("host", "native", "python")


def _rank(backend: str, nbytes: int, iters: int, rounds: int) -> dict[str, Any]:
    import torchcomms

    torch.set_num_threads(1)
    comm = torchcomms.new_comm(backend, torch.device("cpu"), name=unique_name("proxy"))
    peer = 1 - comm.get_rank()
    results: dict[str, Any] = {}
    for figure, size, measure, count in (
        ("bandwidth_gbps", nbytes, _bandwidth, iters),
        ("round_trip_us", 8, _round_trip, 2000),
    ):
        data = torch.ones(size // 4)
        windows, sides, kinds = {}, {}, {}
        for mode in ("native", "python"):  # one window per proxy; the host uses the first
            os.environ["TORCHCOMM_DEVICE_NATIVE_PROXY"] = "1" if mode == "native" else "0"
            win = windows[mode] = comm.new_window(torch.zeros(size // 4))
            win.get_device_window(signal_count=1, counter_count=1)
            kinds[mode] = win._device.proxy_kind
            sides[mode] = _ProxySide(win, peer, win.register_local_buffer(data))
        os.environ.pop("TORCHCOMM_DEVICE_NATIVE_PROXY", None)
        windows["host"], sides["host"] = windows["native"], sides["native"]
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        for mode in MODES:  # warm up
            measure(comm, windows[mode], sides[mode], data, mode, max(1, count // 4))
        for r in range(rounds):
            order = MODES[r % 3 :] + MODES[: r % 3]
            for mode in order:
                samples[mode].append(measure(comm, windows[mode], sides[mode], data, mode, count))
        results[figure] = {mode: statistics.median(v) for mode, v in samples.items()}
        results["proxies"] = kinds
        comm.barrier(False)
        for win in (windows["native"], windows["python"]):
            win.tensor_deregister()
    comm.finalize()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="shm,gloo")
    parser.add_argument("--bytes", type=int, default=64 << 20)
    parser.add_argument("--iters", type=int, default=8, help="puts per bandwidth sample")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from torchcomms_core.bench.probe import memcpy_gbps

    copy = memcpy_gbps()
    rows = []
    with RankPool(2, comm_timeout_s=120) as pool:
        for backend in args.backends.split(","):
            result = pool.run(_rank, backend, args.bytes, args.iters, args.rounds, timeout=900)[0]
            rows.append({"backend": backend, **result})
    load = os.getloadavg()
    print(f"# 2 ranks; memcpy {copy:.1f} GB/s; load average {load[0]:.2f} {load[1]:.2f}")
    print(
        f"# {'backend':8} {'figure':22} {'host':>10} {'C proxy':>10} {'Py proxy':>10} "
        f"{'C/host':>7} {'Py/host':>7}"
    )
    for row in rows:
        for figure, label, form in (
            ("bandwidth_gbps", "put 64 MiB (GB/s)", "10.2f"),
            ("round_trip_us", "8 B round trip (us)", "10.1f"),
        ):
            got = row[figure]
            cells = " ".join(format(got[mode], form) for mode in MODES)
            ratios = " ".join(f"{got[mode] / got['host']:7.2f}" for mode in MODES[1:])
            print(f"  {row['backend']:8} {label:22} {cells} {ratios}")
        if row["proxies"]["native"] != "native":
            print(f"  ({row['backend']}: the C proxy was not available; both columns are Python)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"memcpy_gbps": copy, "load": load, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
