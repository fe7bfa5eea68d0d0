"""``CommOptions``: what a backend's ``init`` receives besides device and name.

The core fills ``store``, ``rank`` and ``size`` from the bootstrap before calling a backend.
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any


@dataclasses.dataclass
class CommOptions:
    """Options of a communicator, as passed to ``TorchCommBackend.init``."""

    abort_process_on_timeout_or_error: bool | None = None
    timeout: timedelta | None = None
    store: Any = None
    name: str = ""
    enable_reconfigure: bool = False
    hints: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Communicator-local rank and size, resolved by the core's bootstrap.
    rank: int = -1
    size: int = -1

    def replace(self, **changes: Any) -> CommOptions:
        return dataclasses.replace(self, **changes)
