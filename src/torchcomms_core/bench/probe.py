"""``torchcomms bench --probe``: what the machine itself allows, to set the figures against.

Memory copy bandwidth on one core, and loopback TCP bandwidth and round-trip latency.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, TextIO

import torch

#: Bytes copied per memcpy measurement: far beyond any cache.
MEMCPY_BYTES = 256 << 20
#: Bytes per loopback bandwidth transfer.
TCP_BYTES = 64 << 20
#: Timed repetitions of each transfer; the median is reported.
REPS = 5
#: One-byte round trips for the latency.
PINGS = 2000
#: Seconds the peer process may take to start and connect.
CONNECT_TIMEOUT_S = 60.0


@dataclass
class ProbeResult:
    """The machine's own limits; GB/s are 10**9 bytes per second."""

    memcpy_gbps: float
    memcpy_bytes: int
    tcp_gbps: float
    tcp_bytes: int
    tcp_rtt_us: float
    pings: int
    reps: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def memcpy_gbps(nbytes: int = MEMCPY_BYTES, reps: int = REPS) -> float:
    """Median GB/s of ``Tensor.copy_`` of ``nbytes`` on one thread (bytes copied per second)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        dst.copy_(src)  # touch every page before timing
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return nbytes / statistics.median(times) / 1e9


def _recv_exactly(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("loopback peer closed the connection early")
        got += n


def _peer(port: int, nbytes: int, reps: int, pings: int) -> None:
    """The other end: absorb ``reps`` transfers (ack each with a byte), then echo ``pings``."""
    with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = memoryview(bytearray(nbytes))
        one = memoryview(bytearray(1))
        for _ in range(reps + 1):
            _recv_exactly(sock, buf)
            sock.sendall(b"k")
        for _ in range(pings):
            _recv_exactly(sock, one)
            sock.sendall(one)


def loopback_tcp(
    nbytes: int = TCP_BYTES, reps: int = REPS, pings: int = PINGS
) -> tuple[float, float]:
    """``(GB/s, round-trip us)`` between this process and a second one over 127.0.0.1.

    Bandwidth: time to send ``nbytes`` until the peer acknowledges the last byte (median
    of ``reps``). Latency: median round trip of a one-byte ping-pong.
    """
    ctx = multiprocessing.get_context("spawn")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(CONNECT_TIMEOUT_S)
        peer = ctx.Process(
            target=_peer,
            args=(listener.getsockname()[1], nbytes, reps, pings),
            name="probe-peer",
            daemon=True,
        )
        peer.start()
        try:
            conn, _addr = listener.accept()
            with conn:
                conn.settimeout(CONNECT_TIMEOUT_S)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                payload = memoryview(bytearray(b"\x01" * nbytes))
                ack = memoryview(bytearray(1))
                times = []
                for rep in range(reps + 1):
                    start = time.perf_counter()
                    conn.sendall(payload)
                    _recv_exactly(conn, ack)
                    if rep:  # the first transfer warms the connection up
                        times.append(time.perf_counter() - start)
                rtts = []
                ping = memoryview(bytearray(1))
                for _ in range(pings):
                    start = time.perf_counter()
                    conn.sendall(ping)
                    _recv_exactly(conn, ping)
                    rtts.append(time.perf_counter() - start)
        finally:
            peer.join(CONNECT_TIMEOUT_S)
            if peer.exitcode is None:
                peer.kill()
                peer.join()
    return nbytes / statistics.median(times) / 1e9, statistics.median(rtts) * 1e6


def run_probe(
    memcpy_bytes: int = MEMCPY_BYTES,
    tcp_bytes: int = TCP_BYTES,
    reps: int = REPS,
    pings: int = PINGS,
) -> ProbeResult:
    """Measure everything ``--probe`` reports."""
    copy = memcpy_gbps(memcpy_bytes, reps)
    gbps, rtt = loopback_tcp(tcp_bytes, reps, pings)
    return ProbeResult(
        memcpy_gbps=copy,
        memcpy_bytes=memcpy_bytes,
        tcp_gbps=gbps,
        tcp_bytes=tcp_bytes,
        tcp_rtt_us=rtt,
        pings=pings,
        reps=reps,
    )


def print_probe(result: ProbeResult, out: TextIO) -> None:
    """The figures, one per line, ``name : value unit``."""
    mib = 1 << 20

    def line(text: str) -> None:
        print(text, file=out, flush=True)

    line(
        f"# torchcomms bench --probe: {socket.gethostname()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}"
    )
    figures = [
        (
            f"memcpy (copy_, 1 thread, {result.memcpy_bytes // mib} MiB)",
            f"{result.memcpy_gbps:8.2f} GB/s",
        ),
        (
            f"loopback TCP bandwidth ({result.tcp_bytes // mib} MiB transfers)",
            f"{result.tcp_gbps:8.2f} GB/s",
        ),
        (
            "loopback TCP round trip (1 byte)",
            f"{result.tcp_rtt_us:8.2f} us (one way {result.tcp_rtt_us / 2:.2f} us)",
        ),
    ]
    width = max(len(name) for name, _value in figures)
    for name, value in figures:
        line(f"{name.ljust(width)} : {value}")
    line(
        f"# medians of {result.reps} transfers and {result.pings} round trips; "
        f"GB/s = 10**9 bytes per second"
    )
