"""Abort for gloo: close the engine's peer connections so operations in flight end now.

``ProcessGroupGloo.abort()`` in torch 2.13 returns at once but leaves an operation that a
peer never joins blocked until its timeout, and tearing the engine down joins its worker
threads, which wait just as long. Shutting down the engine's TCP connections makes every
blocked send, receive and collective fail immediately, on this rank and on its peers (they
see "connection closed", as if this rank had died), which is what abort promises.

The engine does not expose its sockets, so the backend records the sockets that appear
while the engine is built (gloo connects its full mesh eagerly), minus those of the
rendezvous store, and remembers each one's inode so a descriptor number reused later by
someone else is never touched.
"""

from __future__ import annotations

import os
import socket
from typing import Any

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
    """The connected TCP sockets opened since ``before`` that do not talk to a store port."""
    mine: dict[int, str] = {}
    for fd, inode in socket_inodes().items():
        if before.get(fd) == inode:
            continue
        try:
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if probe.family not in (socket.AF_INET, socket.AF_INET6):
                continue
            if probe.type != socket.SOCK_STREAM:
                continue
            if probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                continue  # the device's listener: gloo treats a failed accept as fatal
            ports = {_port(probe.getsockname)}
            ports.add(_port(probe.getpeername))
            if ports & exclude_ports:
                continue
            mine[fd] = inode
        finally:
            probe.close()
    return mine


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
