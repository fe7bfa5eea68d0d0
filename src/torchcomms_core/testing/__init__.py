"""Testing support for torchcomms and for backend authors.

``RankPool`` keeps N live rank processes and runs test bodies on all of them;
``CountingStore`` counts the store operations a step costs, and ``simulated_rank`` lets a
thread play one rank. ``run_conformance`` runs the conformance suite against a backend in
a new process, as a vendor's CI runs it.
"""

from __future__ import annotations

from torchcomms_core.testing.pool import Outcome, RankFailure, RankPool, current_rank, unique_name
from torchcomms_core.testing.runner import conformance_env, run_conformance
from torchcomms_core.testing.store import CountingStore, StoreCounts, simulated_rank

__all__ = [
    "CountingStore",
    "Outcome",
    "RankFailure",
    "RankPool",
    "StoreCounts",
    "conformance_env",
    "current_rank",
    "run_conformance",
    "simulated_rank",
    "unique_name",
]
