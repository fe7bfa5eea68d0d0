"""``torchcomms bench``: nccl-tests style bandwidth and correctness sweeps of collectives.

``ops`` says what each operation does, ``runner`` times and reports it, ``launch`` starts ranks.
"""

from __future__ import annotations

from .ops import OPS, PLUGIN_OPS, BenchOp, available_ops
from .runner import BenchConfig, run_rank
from .sizes import parse_size, size_sweep

__all__ = [
    "OPS",
    "PLUGIN_OPS",
    "BenchConfig",
    "BenchOp",
    "available_ops",
    "parse_size",
    "run_rank",
    "size_sweep",
]
