"""Fused CUDA kernels (CuPy ``RawKernel``) for block quantization of torch tensors.

One kernel computes each block's absmax, scale and int8 values in a single pass over
the data; the other dequantizes, optionally adding into an output. Both follow the
torch-op path in ``quantization`` operation for operation, so they give the same bits.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .constants import FLUSH_BELOW, QMAX

#: Threads per CUDA block; the absmax reduction in shared memory assumes this size.
_THREADS = 256
#: Enough blocks to fill any current GPU; larger grids loop (grid-stride).
_MAX_GRID = 65535

_SOURCE = r"""
extern "C" __global__ void tcq_quantize(
        const float* __restrict__ x, signed char* __restrict__ q, float* __restrict__ scales,
        const long long nblocks, const long long blocks_per_row, const int block_size,
        const long long x_row_stride, const long long q_row_stride,
        const long long s_row_stride, const float qmax, const float flush_below) {
    __shared__ float smax[256];
    __shared__ float sinv;
    for (long long b = blockIdx.x; b < nblocks; b += gridDim.x) {
        const long long row = b / blocks_per_row;
        const long long col = b % blocks_per_row;
        const float* xb = x + row * x_row_stride + col * block_size;
        signed char* qb = q + row * q_row_stride + col * block_size;
        // NaN must win the max (as torch.amax does), so a non-finite block stays visible.
        float m = 0.0f;
        for (int i = threadIdx.x; i < block_size; i += blockDim.x) {
            const float a = fabsf(xb[i]);
            if (a > m || a != a) m = a;
        }
        smax[threadIdx.x] = m;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s) {
                const float o = smax[threadIdx.x + s];
                if (o > smax[threadIdx.x] || o != o) smax[threadIdx.x] = o;
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            const float amax = smax[0];
            const bool small = amax < flush_below;
            scales[row * s_row_stride + col] = small ? 0.0f : __fdiv_rn(amax, qmax);
            sinv = small ? 0.0f : __fdiv_rn(qmax, amax);
        }
        __syncthreads();
        const float inv = sinv;
        for (int i = threadIdx.x; i < block_size; i += blockDim.x) {
            const float v = rintf(__fmul_rn(xb[i], inv));
            qb[i] = (v == v) ? (signed char)v : (signed char)0;
        }
        // smax and sinv are reused by the next block of this loop.
        __syncthreads();
    }
}

extern "C" __global__ void tcq_dequantize(
        const signed char* __restrict__ q, const float* __restrict__ scales,
        float* __restrict__ out, const long long rows, const long long cols,
        const int block_size, const long long q_row_stride, const long long s_row_stride,
        const int accumulate) {
    const long long n = rows * cols;
    for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < n;
         e += (long long)gridDim.x * blockDim.x) {
        const long long row = e / cols;
        const long long col = e % cols;
        const float s = scales[row * s_row_stride + col / block_size];
        // Rounded product, then rounded sum: no FMA, exactly like mul then add_ in torch.
        const float v = __fmul_rn((float)q[row * q_row_stride + col], s);
        out[e] = accumulate ? __fadd_rn(out[e], v) : v;
    }
}
"""


@functools.lru_cache(maxsize=1)
def _load() -> tuple[Any, Any, Any] | str:
    """Compile the kernels once; return ``(cupy, quantize, dequantize)`` or why not."""
    try:
        import cupy
    except Exception as exc:  # any import failure (missing, wrong CUDA) means: use torch ops
        return f"cupy does not import ({type(exc).__name__}: {exc})"
    try:
        module = cupy.RawModule(code=_SOURCE, options=("--std=c++14",))
        return cupy, module.get_function("tcq_quantize"), module.get_function("tcq_dequantize")
    except Exception as exc:  # no driver, no device, NVRTC missing
        return f"the kernels do not compile ({type(exc).__name__}: {exc})"


def available() -> bool:
    """Whether the fused kernels can run here (CuPy imports and compiles them)."""
    return not isinstance(_load(), str)


def unavailable_reason() -> str:
    loaded = _load()
    return loaded if isinstance(loaded, str) else ""


def _kernels() -> tuple[Any, Any, Any]:
    loaded = _load()
    if isinstance(loaded, str):
        raise RuntimeError(f"the CuPy quantization kernels cannot be used: {loaded}")
    return loaded


def _rows(t: torch.Tensor) -> tuple[int, int, int]:
    """``(rows, cols, row stride)`` of a tensor seen as 2-D along its last dimension."""
    cols = t.shape[-1]
    rows = t.numel() // cols if cols else 0
    if t.dim() == 1:
        return rows, cols, cols
    lead = t.reshape(-1, cols) if t.dim() > 2 else t
    if lead.data_ptr() != t.data_ptr() or (rows > 1 and lead.stride(-1) != 1):
        raise ValueError("the CuPy kernels need tensors whose rows are evenly strided")
    return rows, cols, lead.stride(0) if rows > 1 else cols


def _check(t: torch.Tensor, dtype: torch.dtype, name: str) -> None:
    if t.device.type != "cuda" or t.dtype != dtype:
        raise ValueError(f"{name} must be a CUDA {dtype} tensor, got {t.dtype} on {t.device}")
    if t.numel() and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous along its last dimension")


def quantize(
    x: torch.Tensor, block_size: int, q_out: torch.Tensor, scales_out: torch.Tensor
) -> None:
    """Fused absmax + scale + int8 quantization of float32 ``x`` (blocks along the last dim)."""
    cupy, quantize_kernel, _ = _kernels()
    _check(x, torch.float32, "x")
    _check(q_out, torch.int8, "q_out")
    _check(scales_out, torch.float32, "scales_out")
    rows, cols, x_stride = _rows(x)
    _, _, q_stride = _rows(q_out)
    _, _, s_stride = _rows(scales_out)
    blocks_per_row = cols // block_size
    nblocks = rows * blocks_per_row
    if nblocks == 0:
        return
    import numpy as np

    with cupy.cuda.Device(x.device.index), _stream(cupy, x.device):
        quantize_kernel(
            (min(nblocks, _MAX_GRID),),
            (_THREADS,),
            (
                _ptr(x),
                _ptr(q_out),
                _ptr(scales_out),
                np.int64(nblocks),
                np.int64(blocks_per_row),
                np.int32(block_size),
                np.int64(x_stride),
                np.int64(q_stride),
                np.int64(s_stride),
                np.float32(QMAX),
                np.float32(FLUSH_BELOW),
            ),
        )


def dequantize(
    q: torch.Tensor, scales: torch.Tensor, block_size: int, out: torch.Tensor, accumulate: bool
) -> None:
    """``out = q * scale`` per block (``out += ...`` with ``accumulate``); ``out`` contiguous."""
    cupy, _, dequantize_kernel = _kernels()
    _check(q, torch.int8, "q")
    _check(scales, torch.float32, "scales")
    _check(out, torch.float32, "out")
    rows, cols, q_stride = _rows(q)
    _, _, s_stride = _rows(scales)
    total = rows * cols
    if total == 0:
        return
    import numpy as np

    grid = min(-(-total // _THREADS), _MAX_GRID)
    with cupy.cuda.Device(q.device.index), _stream(cupy, q.device):
        dequantize_kernel(
            (grid,),
            (_THREADS,),
            (
                _ptr(q),
                _ptr(scales),
                _ptr(out),
                np.int64(rows),
                np.int64(cols),
                np.int32(block_size),
                np.int64(q_stride),
                np.int64(s_stride),
                np.int32(1 if accumulate else 0),
            ),
        )


def _ptr(t: torch.Tensor) -> Any:
    import numpy as np

    # A device address passed by value: the same 8 bytes a pointer parameter expects.
    return np.uint64(t.data_ptr())


def _stream(cupy: Any, device: torch.device) -> Any:
    # Launch on torch's current stream so the kernels are ordered with the torch ops and
    # collectives around them.
    return cupy.cuda.ExternalStream(torch.cuda.current_stream(device).cuda_stream)
