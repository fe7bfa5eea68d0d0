"""Testing support for torchcomms and for backend authors.

``RankPool`` keeps N live rank processes and runs test bodies on all of them.
"""

from __future__ import annotations

from .pool import Outcome, RankFailure, RankPool, current_rank, unique_name

__all__ = ["Outcome", "RankFailure", "RankPool", "current_rank", "unique_name"]
