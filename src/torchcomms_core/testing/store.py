"""A store that counts what goes through it, and threads that play ranks.

The control plane's cost is counted, not timed: :class:`CountingStore` forwards every call
to a real store (a ``TCPStore`` client, usually) and counts operations, bytes and the
longest key, so a test can assert that creating a communicator costs a constant number of
store operations per rank, and ``benchmarks/scale.py`` can print the figures for
thousands of simulated ranks. :func:`simulated_rank` lets a thread stand for one rank of a
job, so many ranks with real engines fit in one process.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Store

from torchcomms_core.foundation import env as _env

__all__ = ["CountingStore", "StoreCounts", "simulated_rank"]


@dataclass
class StoreCounts:
    """Operations seen by a :class:`CountingStore` (one entry per key for multi-key calls)."""

    ops: Counter[str] = field(default_factory=Counter)
    #: Bytes of keys and values sent and received.
    bytes: int = 0
    #: Length of the longest key used.
    longest_key: int = 0

    @property
    def total(self) -> int:
        """All operations together."""
        return sum(self.ops.values())

    def __sub__(self, other: StoreCounts) -> StoreCounts:
        return StoreCounts(self.ops - other.ops, self.bytes - other.bytes, self.longest_key)


class CountingStore(Store):
    """A c10d ``Store`` that forwards to ``inner`` and counts every operation.

    ``wait`` and ``check`` count one operation per call (the store answers them in one
    round trip) and the bytes of every key. Use :meth:`snapshot` before and after a step;
    :meth:`reset_longest` starts a new longest-key measurement.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner
        self._lock = threading.Lock()
        self._counts = StoreCounts()

    @property
    def inner(self) -> Any:
        """The store every call goes to."""
        return self._inner

    def snapshot(self) -> StoreCounts:
        """A copy of the counts so far."""
        with self._lock:
            c = self._counts
            return StoreCounts(Counter(c.ops), c.bytes, c.longest_key)

    def reset_longest(self) -> None:
        """Forget the longest key seen, so the next step measures its own."""
        with self._lock:
            self._counts.longest_key = 0

    def _count(self, op: str, keys: list[str], nbytes: int = 0) -> None:
        with self._lock:
            c = self._counts
            c.ops[op] += 1
            c.bytes += sum(len(k) for k in keys) + nbytes
            c.longest_key = max([c.longest_key, *(len(k) for k in keys)])

    def set(self, key: str, value: Any) -> None:
        data = value if isinstance(value, (bytes, bytearray)) else str(value).encode()
        self._count("set", [key], len(data))
        self._inner.set(key, data)

    def get(self, key: str) -> bytes:
        value: bytes = self._inner.get(key)
        self._count("get", [key], len(value))
        return value

    def add(self, key: str, value: int) -> int:
        self._count("add", [key], 8)
        return int(self._inner.add(key, value))

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        self._count("compare_set", [key], len(expected) + len(desired))
        result: bytes = self._inner.compare_set(key, expected, desired)
        return result

    def append(self, key: str, value: Any) -> None:
        data = value if isinstance(value, (bytes, bytearray)) else str(value).encode()
        self._count("append", [key], len(data))
        self._inner.append(key, data)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        values: list[bytes] = self._inner.multi_get(keys)
        self._count("multi_get", keys, sum(len(v) for v in values))
        return values

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._count("multi_set", keys, sum(len(v) for v in values))
        self._inner.multi_set(keys, values)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._count("wait", keys)
        if timeout is None:
            self._inner.wait(keys)
        else:
            self._inner.wait(keys, timeout)

    def check(self, keys: list[str]) -> bool:
        self._count("check", keys)
        return bool(self._inner.check(keys))

    def delete_key(self, key: str) -> bool:
        self._count("delete_key", [key])
        return bool(self._inner.delete_key(key))

    def num_keys(self) -> int:
        self._count("num_keys", [])
        return int(self._inner.num_keys())

    def set_timeout(self, timeout: timedelta) -> None:
        super().set_timeout(timeout)
        self._inner.set_timeout(timeout)

    def has_extended_api(self) -> bool:
        return True


@contextlib.contextmanager
def simulated_rank(rank: int, size: int) -> Iterator[None]:
    """Within this block, the calling thread is ``rank`` of ``size`` to ``new_comm``.

    It stands in for a launcher's ``RANK``/``WORLD_SIZE`` so threads of one process can
    play the ranks of a job (pass ``store=`` and ``name=`` to ``new_comm`` as well).
    """
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"simulated_rank: need 0 <= rank < size, got rank {rank} of {size}")
    _env.simulate_rank((rank, size))
    try:
        yield
    finally:
        _env.simulate_rank(None)
