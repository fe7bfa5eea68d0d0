"""``measured``: broadcast and all-gather take staging or direct reads as timings say.

Staging through the arena (two copies: the owner's in, each reader's out) and direct reads
(one kernel copy per reader, ``process_vm_readv``) trade places as the machine changes: on
the 2-core machine of docs/benchmarks.md, a 64 MiB broadcast staged at 8-11 GB/s against
5-6 for direct reads in one state, and at 2-4 against the same 5-6 in another, and the
state changed from one second to the next. A choice taken once (the default rule, or a
table from ``torchcomms tune``) is then wrong half the time.

With ``measured``, rank 0 times each call of a size bucket on the path it chose: the first
call of a bucket stages, the second reads directly, then every call takes the faster by a
moving average of recent times (weight 1/2 for each new time), and every
:data:`EXPLORE` th call takes the other, so a change of state is seen within that many
calls. Rank 0 announces the choice in its control line before the call's first step (one
step more per call), and the others read it after that step, so every rank takes the same
path.

May import: the standard library.
"""

from __future__ import annotations

#: Every this many calls of a bucket, the path that is not the faster runs once.
EXPLORE = 32
#: Weight of a new time in a path's moving average.
WEIGHT = 0.5


class Meter:
    """Rank 0's timings per (operation, size bucket): which path the next call takes."""

    def __init__(self) -> None:
        #: key -> [staged seconds, direct seconds, calls]; ``None``: not timed yet.
        self._seen: dict[tuple[str, int], list[float | None]] = {}

    def pick(self, key: tuple[str, int]) -> bool:
        """Whether the next call of ``key`` reads directly."""
        seen = self._seen.setdefault(key, [None, None, 0.0])
        calls = int(seen[2] or 0) + 1
        seen[2] = float(calls)
        staged, direct = seen[0], seen[1]
        if staged is None:
            return False
        if direct is None:
            return True
        faster = direct < staged
        return (not faster) if calls % EXPLORE == 0 else faster

    def record(self, key: tuple[str, int], direct: bool, seconds: float) -> None:
        """The time the call of ``key`` took on the path it took."""
        seen = self._seen.setdefault(key, [None, None, 0.0])
        i = 1 if direct else 0
        old = seen[i]
        seen[i] = seconds if old is None else (1 - WEIGHT) * old + WEIGHT * seconds

    def averages(self, key: tuple[str, int]) -> tuple[float | None, float | None]:
        """The moving averages (staged, direct) of ``key``, in seconds."""
        seen = self._seen.get(key)
        return (None, None) if seen is None else (seen[0], seen[1])
