"""``GlooBackend``: ``ProcessGroupGloo`` built directly on the communicator's store.

Never touches the global ``init_process_group``; each communicator owns its engine.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, ClassVar

import torch

from torchcomms_core import C10dBackend, CommOptions


class GlooBackend(C10dBackend):
    """CPU communicator on Gloo (TCP), single- or multi-host like torch itself."""

    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    # Gloo has no uneven all-gather or reduce-scatter: the spec's defaults provide them.
    engine_unsupported: ClassVar[frozenset[str]] = frozenset({"all_gather_v", "reduce_scatter_v"})
    # Gloo's reductions have no int16 kernels ("Invalid scalar type"), so refuse it up front.
    supported_dtypes: ClassVar[tuple[torch.dtype, ...]] = (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
    )

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_gloo_available():
            return False, "this PyTorch build has no Gloo support"
        return True, "ok"

    def create_engine(self, store: Any, rank: int, size: int, timeout: timedelta,
                      device: torch.device, options: CommOptions) -> Any:
        from torch.distributed import ProcessGroupGloo

        return ProcessGroupGloo(store, rank, size, timeout)

    def get_backend_name(self) -> str:
        return "gloo"

    def new_window(self) -> Any:
        """A shared-memory window engine (ranks on one host; see ``torchcomms_gloo.window``)."""
        from .window import GlooWindowEngine

        self._windows_made = getattr(self, "_windows_made", 0) + 1
        return GlooWindowEngine(self, self._windows_made)
