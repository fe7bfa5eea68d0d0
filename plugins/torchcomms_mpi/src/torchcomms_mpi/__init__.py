"""torchcomms-mpi: the CPU backend on MPI (mpi4py over MPICH or any MPI-4 library)."""

from __future__ import annotations

from .backend import MpiBackend

__version__ = "0.1.0"
__all__ = ["MpiBackend", "__version__"]
