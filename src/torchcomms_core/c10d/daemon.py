"""A daemon thread, started on first use, that serves a queue in order.

The bridge's background work (settling works whose future was asked for, ending profiler
records for the thread that opened them) runs on such threads. A leaf module: standard
library only.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Daemon(Generic[T]):
    """One daemon thread named ``name`` that calls ``handle(item)`` for each item put, in
    order; it starts on the first :meth:`put` (no thread for a process that never needs
    one). ``handle`` must not raise: the thread serves every later item too."""

    def __init__(self, name: str, handle: Callable[[T], None]) -> None:
        self._name = name
        self._handle = handle
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = False

    def put(self, item: T) -> None:
        """Queue ``item`` for the thread, starting it if this is the first."""
        if not self._started:
            with self._lock:
                if not self._started:
                    threading.Thread(target=self._run, name=self._name, daemon=True).start()
                    self._started = True
        self._queue.put(item)

    def _run(self) -> None:
        while True:
            self._handle(self._queue.get())
