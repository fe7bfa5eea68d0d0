"""The states a communicator moves through (shared by the communicator and fault tolerance).

``OK`` runs operations; ``FINALIZED`` and ``ABORTED`` are terminal; ``FAILED`` follows an
engine error or timeout; ``UNBOUND`` is a communicator created with
``enable_reconfigure=True`` before (or between) successful reconfigures.
"""

from __future__ import annotations

OK = "ok"
FINALIZED = "finalized"
ABORTED = "aborted"
FAILED = "failed"
UNBOUND = "unbound"
