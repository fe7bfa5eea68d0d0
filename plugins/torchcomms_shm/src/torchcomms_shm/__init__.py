"""torchcomms-shm: the CPU backend for ranks on one host, through POSIX shared memory."""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import ShmBackend

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-shm")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["ShmBackend", "__version__"]
