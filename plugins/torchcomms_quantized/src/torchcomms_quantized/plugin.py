"""The ``torchcomms.plugins`` entry point: registers the quantized collectives.

Every ``TorchComm`` then has ``quantized_all_reduce``, ``quantized_reduce_scatter`` and the
reference's ``reduce_scatter_quantized`` (bfloat16 traffic, stochastic rounding).
"""

from __future__ import annotations

from torchcomms_core.plugin import Collective, ReduceOp, hookimpl

from .collectives import quantized_all_reduce, quantized_reduce_scatter
from .stochastic import reduce_scatter_quantized
from .validation import (
    validate_all_reduce,
    validate_reduce_scatter,
    validate_reduce_scatter_quantized,
)

ALL_REDUCE_DOC = """\
quantized_all_reduce(tensor, op=ReduceOp.SUM, async_op=False, *, block_size=256,
dtype=torch.int8): all-reduce a float32, bfloat16 or float16 tensor in place, sending
int8 values with one float32 scale per block of block_size elements (about 25% of the
bytes of a float32 all_reduce). op is ReduceOp.SUM or ReduceOp.AVG. The result is
bit-identical on every rank and, per element of block b, within A_b / 126 of the exact
sum (A_b / (126 n) for AVG), where A_b is the sum over ranks of max|x| over the block;
bfloat16/float16 results add their own final rounding. With async_op=True the
all-to-all phase completes before the call returns; the work covers the all-gather.
"""

REDUCE_SCATTER_DOC = """\
quantized_reduce_scatter(output, input, op=ReduceOp.SUM, async_op=False, *,
block_size=256, dtype=torch.int8): reduce-scatter like reduce_scatter_single
(input.numel() == output.numel() * size) with int8 traffic and one quantization: per
element of block b of the output, within A_b / 250 of the exact result (A_b / (250 n)
for AVG), where A_b is the sum over ranks of max|x| over the block.
"""

REDUCE_SCATTER_QUANTIZED_DOC = """\
reduce_scatter_quantized(output, input, op, seed, async_op=False): the reference's
NCCLX reduce-scatter with bfloat16 traffic, on every backend that sends bfloat16. output
and input are contiguous float32 tensors with input.numel() == output.numel() * size; op
is ReduceOp.SUM or ReduceOp.AVG; seed is a one-element int64 tensor on the communicator's
device. Each rank rounds its input to bfloat16 stochastically (unbiased: the expected
rounded value is the input; error below one bfloat16 step, |x| * 2**-7), reproducibly
for (seed, rank); the chunks travel as bfloat16 (half the bytes of float32) and are added
in float32 in rank order. Equal inputs and seeds give bit-identical results.
"""


@hookimpl
def torchcomms_register_collectives() -> list[Collective]:
    return [
        Collective(
            name="quantized_all_reduce",
            impl=quantized_all_reduce,
            args=("tensor", "op"),
            defaults={"op": ReduceOp.SUM},
            validate=validate_all_reduce,
            doc=ALL_REDUCE_DOC,
            bench="torchcomms_quantized.bench:QuantizedAllReduce",
        ),
        Collective(
            name="quantized_reduce_scatter",
            impl=quantized_reduce_scatter,
            args=("output", "input", "op"),
            defaults={"op": ReduceOp.SUM},
            validate=validate_reduce_scatter,
            doc=REDUCE_SCATTER_DOC,
            bench="torchcomms_quantized.bench:QuantizedReduceScatter",
        ),
        Collective(
            name="reduce_scatter_quantized",
            impl=reduce_scatter_quantized,
            args=("output", "input", "op", "seed"),
            validate=validate_reduce_scatter_quantized,
            doc=REDUCE_SCATTER_QUANTIZED_DOC,
            bench="torchcomms_quantized.bench:ReduceScatterQuantized",
        ),
    ]
