"""``torchcomms bench``: nccl-tests style bandwidth and correctness sweeps of collectives.

``ops`` says what each operation does, ``runner`` times it, ``report``/``results``/``plot``
present it, ``compare`` sets torch.distributed beside it, ``probe`` measures the machine.
"""

from __future__ import annotations

from torchcomms_core.bench.base import BenchOp
from torchcomms_core.bench.ops import DEFAULT_OPS, OPS, available_ops, plugin_ops
from torchcomms_core.bench.runner import BenchConfig, run_rank
from torchcomms_core.bench.sizes import parse_size, size_sweep

__all__ = [
    "DEFAULT_OPS",
    "OPS",
    "BenchConfig",
    "BenchOp",
    "available_ops",
    "parse_size",
    "plugin_ops",
    "run_rank",
    "size_sweep",
]
