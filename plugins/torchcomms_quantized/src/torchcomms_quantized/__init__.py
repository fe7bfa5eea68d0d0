"""torchcomms-quantized: int8 block-quantized all-reduce and reduce-scatter for any backend.

Installing the distribution adds ``quantized_all_reduce`` and ``quantized_reduce_scatter``
to every ``TorchComm`` (entry point ``torchcomms.plugins``: ``torchcomms_quantized.plugin``).
"""

from __future__ import annotations

import importlib.metadata as _metadata

from .bounds import (
    all_reduce_block_absmax,
    all_reduce_error_bound,
    reduce_scatter_block_absmax,
    reduce_scatter_error_bound,
)
from .quantization import dequantize_blocks, quantize_blocks

try:  # one version for every distribution: the core's _version.py, read at build time
    __version__ = _metadata.version("torchcomms-quantized")
except _metadata.PackageNotFoundError:  # imported from a source tree that is not installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "all_reduce_block_absmax",
    "all_reduce_error_bound",
    "dequantize_blocks",
    "quantize_blocks",
    "reduce_scatter_block_absmax",
    "reduce_scatter_error_bound",
]
