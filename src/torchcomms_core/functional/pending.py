"""Collectives in flight that were issued by an async op, keyed by the tensors they write.

The wait ops receive only tensors, so the work behind a tensor is found by its storage
address. An entry lives from the async op to the wait (or the tensor's first use).
"""

from __future__ import annotations

from typing import Any

import torch

# Per process, like the engine's own queue of issued operations: {data_ptr: work}.
_in_flight: dict[int, Any] = {}


def _key(t: torch.Tensor) -> int:
    return t.data_ptr()


def put(tensors: list[torch.Tensor], work: Any) -> None:
    """Record that ``work`` writes ``tensors`` (all wait on the same work)."""
    for t in tensors:
        _in_flight[_key(t)] = work


def take(t: torch.Tensor) -> Any:
    """Remove and return the work writing ``t``, or ``None`` if nothing is in flight."""
    return _in_flight.pop(_key(t), None)


def wait(tensors: list[torch.Tensor]) -> None:
    """Wait for the collectives writing ``tensors``; tensors with none in flight are ready."""
    for t in tensors:
        work = _in_flight.pop(_key(t), None)
        if work is not None:
            work.wait()


def count() -> int:
    """How many tensors still wait on a collective (tests use it to see nothing leaks)."""
    return len(_in_flight)
