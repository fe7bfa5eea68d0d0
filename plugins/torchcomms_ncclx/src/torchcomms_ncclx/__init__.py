"""torchcomms-ncclx: the NVIDIA GPU backend on torch.distributed's NCCL engine.

Registers the backend names ``ncclx`` and ``nccl``. ``comm_dump_all`` and the backend's
``comm_dump``, ``get_nccl_comm_ptr``, ``set_config`` and ``device_alltoallv_single`` are the
reference's NCCLX-only calls, as far as torch's NCCL engine allows (``ncclx_only``).
"""

from __future__ import annotations

import importlib.metadata as _metadata

from .backend import NCCLXBackend, comm_dump_all

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-ncclx")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"
__all__ = ["NCCLXBackend", "__version__", "comm_dump_all"]
