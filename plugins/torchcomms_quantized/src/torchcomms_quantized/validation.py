"""Argument checks of the quantized collectives, run by the core before any communication.

Each returns the arguments with the keyword options filled in, so backends see them all.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from torchcomms_core.plugin import CommInputError, CommTypeError, RedOpType, ReduceOp, TorchComm

DEFAULT_BLOCK_SIZE = 256
#: Element types that can be quantized (converted to float32 exactly first).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Quantized types on the wire.
QUANTIZED_DTYPES = (torch.int8,)
_OPTIONS = ("block_size", "dtype")


def validate_all_reduce(
    comm: TorchComm, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Check ``quantized_all_reduce(tensor, op, *, block_size, dtype)``."""
    name = "quantized_all_reduce"
    tensor, op = args
    comm.checker.tensor(name, "tensor", tensor)
    _floating(name, "tensor", tensor)
    red = _reduce_op(comm, name, op, tensor.dtype)
    return (tensor, red), _options(comm, name, kwargs)


def validate_reduce_scatter(
    comm: TorchComm, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Check ``quantized_reduce_scatter(output, input, op, *, block_size, dtype)``."""
    name = "quantized_reduce_scatter"
    output, input, op = args
    check = comm.checker
    check.tensor(name, "output", output)
    check.tensor(name, "input", input)
    _floating(name, "input", input)
    check.same_dtype(name, "output", output, "input", input)
    _scatter_sizes(comm, name, output, input)
    red = _reduce_op(comm, name, op, input.dtype)
    return (output, input, red), _options(comm, name, kwargs)


def _scatter_sizes(comm: TorchComm, name: str, output: torch.Tensor, input: torch.Tensor) -> None:
    """A reduce-scatter's sizes: ``input.numel() == output.numel() * size``."""
    size = comm.get_size()
    comm.checker.numel(
        name,
        "input",
        input,
        output.numel() * size,
        f"output.numel() * size = {output.numel()} * {size}",
    )


def _floating(name: str, arg: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise CommInputError(
            f"{name}: {arg} has dtype {_short(t.dtype)}, but only float32, bfloat16 and "
            f"float16 tensors can be quantized; use the exact collective for "
            f"{_short(t.dtype)} data"
        )


def _reduce_op(comm: TorchComm, name: str, op: Any, dtype: torch.dtype) -> ReduceOp:
    red = comm.checker.reduce_op(name, op, dtype)
    if red.type not in (RedOpType.SUM, RedOpType.AVG):
        raise CommInputError(
            f"{name}: op must be ReduceOp.SUM or ReduceOp.AVG, got ReduceOp.{red.type.name}; "
            f"the quantization error bound holds for sums and means only, so use the exact "
            f"collective for other reductions"
        )
    return red


def _options(comm: TorchComm, name: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(kwargs) - set(_OPTIONS))
    if unknown:
        raise CommTypeError(
            f"{name}() got unexpected keyword argument(s) {', '.join(map(repr, unknown))}; "
            f"it accepts block_size=, dtype=, hints= and timeout="
        )
    block_size = kwargs.get("block_size", DEFAULT_BLOCK_SIZE)
    if isinstance(block_size, bool):
        raise CommTypeError(f"{name}: block_size must be a positive int, got {block_size!r}")
    try:
        block_size = operator.index(block_size)
    except TypeError:
        raise CommTypeError(
            f"{name}: block_size must be a positive int, got "
            f"{block_size!r} ({type(block_size).__name__})"
        ) from None
    if block_size < 1:
        raise CommInputError(f"{name}: block_size must be a positive int, got {block_size}")
    dtype = kwargs.get("dtype", torch.int8)
    if not isinstance(dtype, torch.dtype):
        raise CommTypeError(f"{name}: dtype must be a torch.dtype (torch.int8), got {dtype!r}")
    if dtype not in QUANTIZED_DTYPES:
        raise CommInputError(
            f"{name}: dtype must be torch.int8, the only quantized type supported, got {dtype}"
        )
    backend = comm.get_backend_impl()
    if not callable(getattr(backend, name, None)) and dtype not in type(backend).supported_dtypes:
        raise CommInputError(
            f"{name}: backend {comm.get_backend()!r} cannot transfer {_short(dtype)} tensors, "
            f"which the portable {name} sends; use the exact collective on this backend"
        )
    return {"block_size": block_size, "dtype": dtype}


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def validate_reduce_scatter_quantized(
    comm: TorchComm, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Check ``reduce_scatter_quantized(output, input, op, seed)`` as the reference does:
    float32 contiguous tensors, ``input.numel() == output.numel() * size``, a one-element
    int64 ``seed`` tensor on the communicator's device, SUM or AVG, no keyword options."""
    name = "reduce_scatter_quantized"
    output, input, op, seed = args
    if kwargs:
        raise CommTypeError(
            f"{name}() got unexpected keyword argument(s) "
            f"{', '.join(map(repr, sorted(kwargs)))}; it takes (output, input, op, seed, "
            f"async_op) and hints= and timeout="
        )
    check = comm.checker
    for arg, t in (("output", output), ("input", input)):
        check.tensor(name, arg, t)
        if t.dtype != torch.float32:
            raise CommInputError(
                f"{name}: {arg} must be float32 (it is rounded to bfloat16 on the wire and "
                f"reduced in float32), got {_short(t.dtype)}; convert with .float() or use "
                f"quantized_reduce_scatter for bfloat16/float16 data"
            )
        if not t.is_contiguous():
            raise CommInputError(
                f"{name}: {arg} must be contiguous (shape {tuple(t.shape)}, strides "
                f"{t.stride()}); pass {arg}.contiguous()"
            )
    _scatter_sizes(comm, name, output, input)
    if not isinstance(seed, torch.Tensor):
        raise CommTypeError(
            f"{name}: seed must be a one-element int64 tensor on the communicator's device "
            f"(torch.tensor([42], dtype=torch.int64, device={str(comm.get_device())!r})), "
            f"got {type(seed).__name__}"
        )
    if seed.dtype != torch.int64 or seed.numel() != 1:
        raise CommInputError(
            f"{name}: seed must be a one-element int64 tensor; got dtype={_short(seed.dtype)}, "
            f"numel={seed.numel()}"
        )
    check.tensor(name, "seed", seed)  # on the communicator's device
    red = _reduce_op(comm, name, op, input.dtype)
    backend = comm.get_backend_impl()
    if not callable(getattr(backend, name, None)) and (
        torch.bfloat16 not in type(backend).supported_dtypes
    ):
        raise CommInputError(
            f"{name}: backend {comm.get_backend()!r} cannot transfer bfloat16 tensors, which "
            f"the portable {name} sends; use reduce_scatter_single on this backend"
        )
    return (output, input, red, seed), {}
