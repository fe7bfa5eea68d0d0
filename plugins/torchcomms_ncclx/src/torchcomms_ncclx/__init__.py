"""torchcomms-ncclx: the NVIDIA GPU backend on torch.distributed's NCCL engine.

Registers the backend names ``ncclx`` and ``nccl``.
"""

from __future__ import annotations

from .backend import NCCLXBackend

__version__ = "0.1.0"
__all__ = ["NCCLXBackend", "__version__"]
