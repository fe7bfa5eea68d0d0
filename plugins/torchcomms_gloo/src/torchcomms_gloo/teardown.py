"""Abort for gloo: close the engine's peer connections so operations in flight end now.

``ProcessGroupGloo.abort()`` in torch 2.13 returns at once but leaves an operation that a
peer never joins blocked until its timeout, and tearing the engine down joins its worker
threads, which wait just as long. Shutting down the engine's TCP connections makes every
blocked send, receive and collective fail immediately, on this rank and on its peers (they
see "connection closed", as if this rank had died), which is what abort promises.

The engine does not expose its sockets. Eagerly (the default) gloo connects its full mesh
while it is built, so the backend records the sockets that appear meanwhile, minus those of
the rendezvous store (``engine_sockets``). Lazily (hint ``lazy``) the engine connects on
first use, long after it was built, so abort looks again (``close_lazy_engine``): it picks
the engine's connections by their endpoints (``connections``: accepted by the engine's own
listener, or made to one of the peers' listeners, both learned from the addresses the
engine exchanged, see ``peer_addresses.py``), and it wakes the pairs that wait for a peer
to connect to them (``wake_waiting_pairs``). Another communicator's engine has other
listeners on both sides, so its connections are left alone. Each socket is identified by
descriptor and inode, so a descriptor number reused later by someone else is never
touched.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from collections.abc import Iterator, Set
from typing import Any

from .peer_addresses import Endpoint, EngineAddresses, normalize_ip

_FD_DIR = "/proc/self/fd"


def socket_inodes() -> dict[int, str]:
    """Map each open socket descriptor of this process to its ``socket:[inode]`` name."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(_FD_DIR)
    except OSError:  # not Linux: abort falls back to the engine's own
        return found
    for name in names:
        try:
            target = os.readlink(f"{_FD_DIR}/{name}")
        except OSError:
            continue
        if target.startswith("socket:"):
            found[int(name)] = target
    return found


def store_ports(store: Any) -> set[int]:
    """Ports of the TCP stores under ``store`` (through PrefixStores)."""
    ports: set[int] = set()
    seen = 0
    while store is not None and seen < 16:
        port = getattr(store, "port", None)
        if isinstance(port, int):
            ports.add(port)
        store = getattr(store, "underlying_store", None)
        seen += 1
    return ports


def engine_sockets(before: dict[int, str], exclude_ports: set[int]) -> dict[int, str]:
    """The connected TCP sockets opened since ``before`` that do not talk to a store port
    and were not accepted by a listener open before (``before``'s).

    An older engine of this process may accept a connection while this one is built: a
    lazy one whose peer has just started to use it. That connection is the older engine's
    (its local port is that engine's listener's), and aborting this engine must not close
    it.
    """
    older_listeners = {
        _port(probe.getsockname)
        for fd, inode, probe in _tcp_streams()
        if before.get(fd) == inode and probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    }
    mine: dict[int, str] = {}
    for fd, inode, probe in _tcp_streams(before):
        if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            continue  # the device's listener: gloo treats a failed accept as fatal
        local = _port(probe.getsockname)
        if local is not None and local in older_listeners:
            continue  # accepted by an older engine's listener
        if {local, _port(probe.getpeername)} & exclude_ports:
            continue
        mine[fd] = inode
    return mine


def _tcp_streams(before: dict[int, str] | None = None) -> Iterator[tuple[int, str, socket.socket]]:
    """This process's TCP stream sockets, but those ``before`` lists (same fd and inode):
    ``(fd, inode, probe)``, ``probe`` a duplicate of the socket, closed once the loop moves
    on."""
    for fd, inode in socket_inodes().items():
        if before is not None and before.get(fd) == inode:
            continue
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if (
                probe.family in (socket.AF_INET, socket.AF_INET6)
                and probe.type == socket.SOCK_STREAM
            ):
                yield fd, inode, probe
        finally:
            probe.close()


def connections(own: Set[Endpoint], peers: Set[Endpoint]) -> tuple[dict[int, str], dict[int, str]]:
    """This process's TCP sockets with an endpoint of one engine: ``(connections, listeners)``.

    A connected socket is the engine's when its local endpoint is one of the engine's
    listeners (``own``: accepted from a peer) or its remote endpoint is a peer's listener
    (``peers``: connected to it). The engine's listeners are returned apart: abort leaves
    them open, as gloo treats a failed accept as fatal.
    """
    mine: dict[int, str] = {}
    listening: dict[int, str] = {}
    if not own and not peers:
        return mine, listening
    own_ports = {port for _, port in own}
    peer_ports = {port for _, port in peers}
    for fd, inode, probe in _tcp_streams():
        try:
            local = _endpoint(probe.getsockname)
            ours = local is not None and local[1] in own_ports and _matches(local, own)
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                if ours:
                    listening[fd] = inode
                continue
            if ours:
                mine[fd] = inode
                continue
            remote = _endpoint(probe.getpeername)
            if remote is not None and remote[1] in peer_ports and _matches(remote, peers):
                mine[fd] = inode
        except OSError:
            continue
    return mine, listening


def wake_waiting_pairs(listener: Endpoint, ranks: Set[int], timeout_s: float = 1.0) -> int:
    """Hand every pair of a lazy engine that waits for a peer to connect a closed connection.

    Lazily, of the two ranks of a pair one connects and the other waits for it on its
    listener, for as long as the engine's timeout, with no socket abort could shut down.
    Gloo's listener tells waiting pairs apart by the number the connecting side sends
    first, which under lazy init is the connecting peer's rank (a 64-bit integer in host
    byte order). So for each peer ``rank`` the engine contacted, connect to the engine's
    own ``listener``, send that number and close: a pair waiting for that peer takes the
    connection, finds it closed and fails its operation now; a pair that is connected
    already leaves it unclaimed in the listener. Returns how many connections were made.
    """
    ip, port = listener
    if ip in ("0.0.0.0", "::"):
        ip = "127.0.0.1" if ip == "0.0.0.0" else "::1"
    made = 0
    for rank in sorted(ranks):
        try:
            with socket.create_connection((ip, port), timeout=timeout_s) as conn:
                conn.sendall(_SEQUENCE.pack(rank))
            made += 1
        except OSError:
            break  # the listener is gone: the engine is being torn down already
    return made


_SEQUENCE = struct.Struct("=q")  # gloo's sequence_number_t: a native long

#: When abort looks again (seconds after the first look): a lazy engine thread that read a
#: peer's address just before abort may open its connection a moment later.
SWEEP_DELAYS_S: tuple[float, ...] = (0.05, 0.25, 1.0)


def close_lazy_engine(addresses: EngineAddresses, *, sweep: bool = True) -> None:
    """Abort's work for a lazy engine: shut its connections down and wake its waiting pairs.

    Done now, then again a few times over about a second from a daemon thread (``sweep``),
    for a connection a thread of the engine was opening at the moment of abort; the
    later looks stop once the engine's listener is closed, so they never touch a
    listener someone else opens on the same port afterwards.
    """
    woken: set[tuple[str, int]] = set()
    listeners = _close_once(addresses, woken)
    if sweep and listeners:
        threading.Thread(
            target=_sweep, args=(addresses, woken, listeners), name="gloo-abort", daemon=True
        ).start()


def _close_once(addresses: EngineAddresses, woken: set[tuple[str, int]]) -> dict[int, str]:
    own, peers = addresses.snapshot()
    mine, listeners = connections(set(own.values()), set(peers.values()))
    shut_down(mine)
    for device, listener in own.items():
        ranks = {r for (d, r) in peers if d == device and r is not None and (d, r) not in woken}
        wake_waiting_pairs(listener, ranks)
        woken.update((device, r) for r in ranks)
    return listeners


def _sweep(
    addresses: EngineAddresses, woken: set[tuple[str, int]], listeners: dict[int, str]
) -> None:
    for delay in SWEEP_DELAYS_S:
        time.sleep(delay)
        current = socket_inodes()
        if not any(current.get(fd) == inode for fd, inode in listeners.items()):
            return  # the engine is gone, and its connections with it
        _close_once(addresses, woken)


def _matches(endpoint: Endpoint, listeners: Set[Endpoint]) -> bool:
    """Whether ``endpoint`` is one of ``listeners`` (a wildcard listener matches any IP)."""
    ip, port = endpoint
    return any(p == port and (i == ip or i in ("0.0.0.0", "::")) for i, p in listeners)


def _endpoint(get: Any) -> Endpoint | None:
    try:
        address = get()
        return normalize_ip(str(address[0])), int(address[1])
    except (OSError, IndexError, TypeError, ValueError):
        return None


def _port(get: Any) -> int | None:
    try:
        return int(get()[1])
    except (OSError, IndexError, TypeError, ValueError):
        return None


def shut_down(sockets: dict[int, str]) -> int:
    """Shut down each recorded socket that is still the one recorded; returns how many."""
    current = socket_inodes()
    done = 0
    for fd, inode in sockets.items():
        if current.get(fd) != inode:
            continue  # closed by the engine already, maybe reused: not ours any more
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            s.shutdown(socket.SHUT_RDWR)
            done += 1
        except OSError:
            pass  # not connected (a listener) or already shut down
        finally:
            s.close()
    return done
