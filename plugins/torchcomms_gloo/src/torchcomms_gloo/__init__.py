"""torchcomms-gloo: the CPU backend on torch.distributed's Gloo engine."""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import GlooBackend

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-gloo")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["GlooBackend", "__version__"]
