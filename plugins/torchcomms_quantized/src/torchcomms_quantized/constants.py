"""The numbers the quantization and its CUDA kernels share (a leaf module: no imports)."""

from __future__ import annotations

#: Largest quantized magnitude: int8 values lie in [-127, 127], symmetric around zero.
QMAX = 127
#: Blocks whose largest magnitude is below this are sent as zeros. ``127 / absmax`` would
#: overflow float32 for the tiniest blocks; flushing costs at most 2**-100 per element.
FLUSH_BELOW = 2.0**-100
#: Elements per slice of the torch-op path on CPU: its temporaries stay in cache, which
#: makes large tensors several times faster than whole-tensor ops.
CPU_SLICE = 1 << 17
