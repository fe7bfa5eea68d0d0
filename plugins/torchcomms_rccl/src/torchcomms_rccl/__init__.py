"""torchcomms-rccl: the AMD GPU backend on a ROCm build of torch (its NCCL engine is RCCL).

Registers the backend name ``rccl``.
"""

from __future__ import annotations

from .backend import RCCLBackend

__version__ = "0.1.0"
__all__ = ["RCCLBackend", "__version__"]
