"""Byte sizes for ``torchcomms bench``: parse ``64K``-style strings and build the sweep.

Suffixes are powers of 1024, as in nccl-tests.
"""

from __future__ import annotations

import re

#: Sizes below this are timed over ``SMALL_MIN_CALLS`` calls unless ``--iters`` is given:
#: one late call (a scheduler tick, another process) in 20 would set the mean of a call
#: that takes microseconds. nccl-tests reports the mean too, over its ``-n`` calls.
SMALL_SIZE = 64 << 10
SMALL_MIN_CALLS = 200
#: Calls timed per size from ``SMALL_SIZE`` on, unless ``--iters`` is given.
DEFAULT_ITERS = 20


_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"\s*(\d+)\s*([KMG]?)\s*", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Return the byte count written as ``8``, ``64K``, ``1M`` or ``2G``.

    Raises ``ValueError`` with a message that shows the accepted forms.
    """
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: expected a whole number of bytes with an optional K, M or G "
            f"suffix (powers of 1024), e.g. 8, 64K, 1M, 2G"
        )
    value = int(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    if value < 1:
        raise ValueError(f"invalid size {text!r}: must be at least 1 byte")
    return value


def size_sweep(minbytes: int, maxbytes: int, stepfactor: int) -> list[int]:
    """Sizes from ``minbytes`` up to ``maxbytes`` inclusive, each ``stepfactor`` times the last."""
    if minbytes < 1:
        raise ValueError(f"minbytes must be at least 1, got {minbytes}")
    if maxbytes < minbytes:
        raise ValueError(f"maxbytes ({maxbytes}) must not be smaller than minbytes ({minbytes})")
    if stepfactor < 2:
        raise ValueError(f"stepfactor must be at least 2, got {stepfactor}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= stepfactor
    return sizes
