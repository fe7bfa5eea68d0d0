"""torchcomms-mpi: the CPU backend on MPI (mpi4py over MPICH or any MPI-4 library)."""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import MpiBackend

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-mpi")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["MpiBackend", "__version__"]
