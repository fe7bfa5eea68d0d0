"""torchcomms-gloo: the CPU backend on torch.distributed's Gloo engine."""

from __future__ import annotations

from .backend import GlooBackend

__version__ = "0.1.0"
__all__ = ["GlooBackend", "__version__"]
