"""torchcomms-ncclx: the NVIDIA GPU backend on torch.distributed's NCCL engine.

Registers the backend names ``ncclx`` and ``nccl``.
"""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import NCCLXBackend

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-ncclx")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["NCCLXBackend", "__version__"]
