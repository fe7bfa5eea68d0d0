"""torchcomms-rccl: the AMD GPU backend on a ROCm build of torch (its NCCL engine is RCCL).

Registers the backend name ``rccl``.
"""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import RCCLBackend

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-rccl")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["RCCLBackend", "__version__"]
