"""``measured``: broadcast and all-gather take staging or direct reads as timings say.

Staging through the arena (two copies: the owner's in, each reader's out) and direct reads
(one kernel copy per reader, ``process_vm_readv``) trade places as the machine changes: on
the 2-core machine of docs/benchmarks.md, a 64 MiB broadcast staged at 8-11 GB/s against
5-6 for direct reads in one state, and at 2-4 against the same 5-6 in another, and the
state changed from one second to the next. A choice taken once (the default rule, or a
table from ``torchcomms tune``) is then wrong half the time.

With ``measured``, rank 0 times each call of a size bucket on the path it chose: the first
four calls of a bucket alternate (staged, direct, staged, direct; a path's first time,
with its page faults and cold caches, is replaced by its second), then every call takes
the faster by a moving average of recent times (weight 1/2 for each new time), and every
:data:`EXPLORE` th call takes the other, so a change of state is seen within that many
calls. Rank 0 announces the choice in its control line before the call's first step (one
step more per call), and the others read it after that step, so every rank takes the same
path. A closing step (one more) ends the timed span when the slowest rank is done, so the
time is the call's, not rank 0's share of it.

May import: the standard library.
"""

from __future__ import annotations

#: Every this many calls of a bucket, the path that is not the faster runs once.
EXPLORE = 32
#: Weight of a new time in a path's moving average.
WEIGHT = 0.5
#: Times each path runs, in turn, before the faster is chosen (the last one counts).
WARM = 2


class Meter:
    """Rank 0's timings per (operation, size bucket): which path the next call takes."""

    def __init__(self) -> None:
        #: key -> [staged seconds, direct seconds, calls, staged samples, direct samples].
        self._seen: dict[tuple[str, int], list[float]] = {}

    def _entry(self, key: tuple[str, int]) -> list[float]:
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = [0.0, 0.0, 0.0, 0.0, 0.0]
        return seen

    def pick(self, key: tuple[str, int]) -> bool:
        """Whether the next call of ``key`` reads directly."""
        seen = self._entry(key)
        seen[2] += 1
        if seen[3] < WARM or seen[4] < WARM:
            # Each path runs WARM times first, in turn; its first time (page faults, cold
            # caches) is replaced by its second, not averaged.
            return seen[4] < seen[3]
        faster = seen[1] < seen[0]
        return (not faster) if int(seen[2]) % EXPLORE == 0 else faster

    def record(self, key: tuple[str, int], direct: bool, seconds: float) -> None:
        """The time the call of ``key`` took on the path it took."""
        seen = self._entry(key)
        i = 1 if direct else 0
        samples = seen[3 + i]
        seen[3 + i] = samples + 1
        seen[i] = seconds if samples < WARM else (1 - WEIGHT) * seen[i] + WEIGHT * seconds

    def averages(self, key: tuple[str, int]) -> tuple[float | None, float | None]:
        """The moving averages (staged, direct) of ``key`` in seconds (``None``: not run)."""
        seen = self._seen.get(key)
        if seen is None:
            return None, None
        return (seen[0] if seen[3] else None), (seen[1] if seen[4] else None)
