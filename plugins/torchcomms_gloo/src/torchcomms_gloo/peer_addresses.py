"""Learn which TCP endpoints belong to one gloo engine from the addresses it exchanges.

Each gloo device listens on a port of its own and publishes its address in the store once,
at creation; a rank reads a peer's address when it first contacts that peer (all at creation
when connecting eagerly, on first use when lazy). Every connection of the engine therefore
either was accepted by its own listener (local endpoint == own listener) or was made to a
peer's listener (remote endpoint == that peer's listener), and another engine in the same
process has other listeners on both sides. :class:`RecordingStore` sits between a lazy
engine and the communicator's store, forwards every call unchanged, and notes the listener
addresses in the values gloo writes and reads anyway: no store traffic of its own, so abort
never needs the store (which may be dead by then). Eager engines are built on the store
directly: they connect while being built, so the sockets that appear then are theirs, and
a Python store would add about 1 ms to each build.

The value gloo stores for a rank (torch 2.13) is, little-endian::

    u64 hostname length | hostname | u64 address length | address | (eager) pair sequence numbers

where the address is the device's ``sockaddr_storage`` (family in host order, port in
network order) followed by a sequence number. A value that does not parse is counted in
:attr:`EngineAddresses.unparsed`; when this rank's own address does not parse, the backend
falls back to the sockets recorded at creation (see ``teardown.py``), which for a lazy
engine are none: abort then ends an operation in flight only at its timeout.
"""

from __future__ import annotations

import socket
import struct
import threading
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Store

Endpoint = tuple[str, int]  # (normalized IP address, port)

_U64 = struct.Struct("<Q")
_FAMILY = struct.Struct("=H")  # sa_family_t, host order
_PORT = struct.Struct(">H")  # in_port_t, network order
_MAX_HOSTNAME = 1024  # a longer "hostname" means the layout is not the one described above


def parse_address(value: bytes) -> Endpoint | None:
    """The listener endpoint in a rank's address value, or None when it does not parse."""
    try:
        (host_len,) = _U64.unpack_from(value, 0)
        if host_len > _MAX_HOSTNAME:
            return None
        offset = _U64.size + host_len
        (addr_len,) = _U64.unpack_from(value, offset)
        offset += _U64.size
        if addr_len < 8 or offset + addr_len > len(value):
            return None
        addr = value[offset : offset + addr_len]
        (family,) = _FAMILY.unpack_from(addr, 0)
        (port,) = _PORT.unpack_from(addr, 2)
        if family == socket.AF_INET:
            ip = socket.inet_ntop(socket.AF_INET, addr[4:8])
        elif family == socket.AF_INET6 and addr_len >= 24:
            ip = socket.inet_ntop(socket.AF_INET6, addr[8:24])
        else:
            return None
    except (struct.error, ValueError, OSError):
        return None
    if port == 0:
        return None
    return normalize_ip(ip), port


def normalize_ip(ip: str) -> str:
    """One spelling per address: an IPv4-mapped IPv6 address becomes the IPv4 one."""
    ip = ip.split("%", 1)[0]  # scope id of a link-local address
    if ip.lower().startswith("::ffff:") and "." in ip:
        return ip[7:]
    return ip


class EngineAddresses:
    """The listener endpoints one engine published (``own``) and read (``peers``).

    Gloo's keys are ``"<device>/<rank>"``; ``own`` maps a device to this rank's listener
    on it, ``peers`` maps ``(device, rank)`` to a peer's (rank None when a key does not
    have that form).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.own: dict[str, Endpoint] = {}
        self.peers: dict[tuple[str, int | None], Endpoint] = {}
        self.unparsed = 0
        self.closed = False

    def saw(self, key: str, value: bytes, *, published: bool) -> None:
        """Note the address in a value the engine wrote (``published``) or read."""
        endpoint = parse_address(value)
        device, _, tail = key.rpartition("/")
        rank = int(tail) if tail.isdigit() else None
        with self._lock:
            if endpoint is None:
                self.unparsed += 1
            elif published:
                self.own[device] = endpoint
            elif endpoint != self.own.get(device):  # eagerly a rank reads its own too
                self.peers[(device, rank)] = endpoint

    def snapshot(
        self,
    ) -> tuple[dict[str, Endpoint], dict[tuple[str, int | None], Endpoint]]:
        """``(own, peers)`` as they are now (the engine's threads may add peers)."""
        with self._lock:
            return dict(self.own), dict(self.peers)

    @property
    def complete(self) -> bool:
        """Whether every value seen parsed and this rank's own address is known."""
        with self._lock:
            return self.unparsed == 0 and bool(self.own)


def _as_bytes(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


class RecordingStore(Store):
    """Forwards every call to ``inner``; notes the addresses gloo writes and reads.

    Once :meth:`close` has been called (by abort), the engine's further reads and waits
    fail at once with an error saying the communicator was aborted, without touching the
    store: an engine thread about to connect to a new peer then gives up instead of
    opening a connection abort could no longer see.
    """

    def __init__(self, inner: Any, addresses: EngineAddresses) -> None:
        super().__init__()
        self.inner = inner
        self.addresses = addresses
        try:
            super().set_timeout(inner.timeout)
        except (AttributeError, RuntimeError, TypeError):
            pass  # the base's default applies to calls without a timeout of their own

    def close(self) -> None:
        """Refuse the engine's further reads (abort)."""
        self.addresses.closed = True

    def _check_open(self) -> None:
        if self.addresses.closed:
            raise RuntimeError(
                "the communicator was aborted: its engine may not contact further peers"
            )

    def set(self, key: str, value: Any) -> None:
        """Forwarded; the value is noted as this rank's published address."""
        self.inner.set(key, value)
        self.addresses.saw(key, _as_bytes(value), published=True)

    def get(self, key: str) -> bytes:
        """Forwarded; the value is noted as a peer's address."""
        self._check_open()
        value = self.inner.get(key)
        self.addresses.saw(key, _as_bytes(value), published=False)
        return value  # type: ignore[no-any-return]

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """Forwarded; each value is noted as a peer's address."""
        self._check_open()
        values: list[bytes] = self.inner.multi_get(keys)
        for key, value in zip(keys, values, strict=False):
            self.addresses.saw(key, _as_bytes(value), published=False)
        return values

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        """Forwarded; each value is noted as this rank's published address."""
        self.inner.multi_set(keys, values)
        for key, value in zip(keys, values, strict=False):
            self.addresses.saw(key, _as_bytes(value), published=True)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        """Forwarded (with the caller's timeout when it gives one)."""
        self._check_open()
        if timeout is None:
            self.inner.wait(keys)
        else:
            self.inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        """Forwarded."""
        return bool(self.inner.check(keys))

    def add(self, key: str, value: int) -> int:
        """Forwarded."""
        return int(self.inner.add(key, value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        """Forwarded."""
        return self.inner.compare_set(key, expected, desired)  # type: ignore[no-any-return]

    def append(self, key: str, value: Any) -> None:
        """Forwarded."""
        self.inner.append(key, value)

    def delete_key(self, key: str) -> bool:
        """Forwarded."""
        return bool(self.inner.delete_key(key))

    def num_keys(self) -> int:
        """Forwarded."""
        return int(self.inner.num_keys())

    def has_extended_api(self) -> bool:
        """Forwarded."""
        return bool(self.inner.has_extended_api())

    def set_timeout(self, timeout: timedelta) -> None:
        """Forwarded (and kept as this wrapper's default)."""
        self.inner.set_timeout(timeout)
        super().set_timeout(timeout)

    def clone(self) -> RecordingStore:
        """A wrapper over a clone of the inner store, noting into the same record."""
        return RecordingStore(self.inner.clone(), self.addresses)
