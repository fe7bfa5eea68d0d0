"""The work of a gloo receive from any source: it knows who sent once it completed."""

from __future__ import annotations

from torchcomms_core.plugin import C10dWork


class AnySourceWork(C10dWork):
    """A c10d receive work whose ``source_rank()`` is the rank that sent."""

    __slots__ = ()

    def source_rank(self) -> int:
        return int(self._work._source_rank())  # the c10d work this one wraps
