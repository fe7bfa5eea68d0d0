"""What a plugin needs to give its collective a benchmark: ``Collective(bench=...)``.

Plugins reach it as ``torchcomms_core.plugin.bench``. A benchmark is a :class:`BenchOp`:
it allocates the buffers, says what every rank puts in its input (``input_values``) and
what its output must hold after one run (``expected_values``: the exact result, or
``count_wrong`` for an approximate one), runs the collective once (``run``), and gives the
share of the data that crosses the bus (``busbw_factor``; with the buffer size that is
the bytes moved). Most plugin collectives share the buffers and data of a built-in
operation, so subclassing :class:`PluginOp` and that operation is enough::

    class MyAllReduce(bench.PluginOp, bench.AllReduce):
        name = "my_all_reduce"

        def run(self, comm, bufs, case):
            comm.my_all_reduce(bufs.output, case.reduce_op)

``torchcomms bench --ops my_all_reduce`` then finds it while the plugin is installed.
"""

from __future__ import annotations

from torchcomms_core.bench.base import BenchOp, PairOp
from torchcomms_core.bench.data import (
    BLOCK,
    IN_PLACE,
    NO_BUFFERS,
    OUT_OF_PLACE,
    Buffers,
    Case,
    blocks,
    dtype_name,
    fill,
    starts,
    uneven_sizes,
    values,
)
from torchcomms_core.bench.ops import (
    AllGatherSingle,
    AllReduce,
    AllToAllSingle,
    Broadcast,
    PluginOp,
    ReduceScatterSingle,
)

__all__ = [
    "BLOCK",
    "IN_PLACE",
    "NO_BUFFERS",
    "OUT_OF_PLACE",
    "AllGatherSingle",
    "AllReduce",
    "AllToAllSingle",
    "BenchOp",
    "Broadcast",
    "Buffers",
    "Case",
    "PairOp",
    "PluginOp",
    "ReduceScatterSingle",
    "blocks",
    "dtype_name",
    "fill",
    "starts",
    "uneven_sizes",
    "values",
]
