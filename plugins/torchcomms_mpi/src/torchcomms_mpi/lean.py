"""The mpi backend's calls for the core's lean lane, made for one backend.

Blocking ``all_reduce``, ``broadcast`` and ``all_to_all_single`` that keep the MPI buffer
specs of recent tensors; larger calls go to the backend's methods.
:meth:`~torchcomms_mpi.backend.MpiBackend.lean_calls` returns what :func:`lean_calls` makes.

May import: torch, ``torchcomms_core.plugin`` and this package's ``comm``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.plugin import ReduceOp

from .comm import MpiComm


def lean_calls(backend: MpiComm, timeout: timedelta, hints: dict[str, str]) -> dict[str, Any]:
    """``backend``'s blocking ``all_reduce``, ``broadcast`` and ``all_to_all_single`` for
    the core's lean lane (``TorchCommBackend.lean_calls``).

    The core calls these only with what its lean lane checked (see
    ``TorchCommBackend.lean_calls``), so they skip the methods' keyword handling and
    keep the MPI buffer specs of recent tensors, keyed by address, size, dtype (and
    reduction): building one costs about as much as a blocking call on one element.
    Larger collectives go to ``backend``'s methods. None when small collectives are not
    blocking (``TORCHCOMM_MPI_BLOCKING_BYTES=0``). The calls store the watchdog's slot
    (``backend._watch``) themselves, as the methods do: one function call less at one
    element.
    """
    small = backend._small
    if not small:
        return {}
    comm, MPI = backend._comm, backend._MPI
    fa, types, ops, mpi_op = backend._fa, backend._types, backend._ops, backend._b.mpi_op
    Allreduce, Bcast, Alltoall, IN_PLACE = (
        comm.Allreduce,
        comm.Bcast,
        comm.Alltoall,
        MPI.IN_PLACE,
    )
    seconds = backend._seconds(timeout)
    choose = backend.tuning.choose  # blocking or not: the same answer on every rank (#45)
    specs: dict[tuple[Any, ...], Any] = {}
    limit = 64  # a training step reuses a handful of buffers; forget older ones

    def all_reduce(tensor: torch.Tensor, op: ReduceOp) -> Any:
        nbytes = tensor.nbytes
        if choose("all_reduce", nbytes, tensor.dtype).algorithm != "blocking":
            return backend.all_reduce(tensor, op, False, timeout=timeout, hints=hints)
        key = (tensor.data_ptr(), nbytes, tensor.dtype, op._type)
        spec = specs.get(key)
        if spec is None:
            if len(specs) >= limit:
                specs.clear()
            dtype = key[2]
            spec = specs[key] = (
                [fa(key[0], nbytes), types[dtype]],
                ops.get((dtype, op._type)) or mpi_op(op, dtype),
            )
        backend._watch = ("all_reduce", seconds)
        try:
            Allreduce(IN_PLACE, spec[0], spec[1])
        finally:
            backend._watch = None
        return None

    def broadcast(tensor: torch.Tensor, root: int) -> Any:
        nbytes = tensor.nbytes
        if choose("broadcast", nbytes, tensor.dtype).algorithm != "blocking":
            return backend.broadcast(tensor, root, False, timeout=timeout, hints=hints)
        key = (tensor.data_ptr(), nbytes, tensor.dtype)
        spec = specs.get(key)
        if spec is None:
            if len(specs) >= limit:
                specs.clear()
            spec = specs[key] = [fa(key[0], nbytes), types[key[2]]]
        backend._watch = ("broadcast", seconds)
        try:
            Bcast(spec, root)
        finally:
            backend._watch = None
        return None

    def all_to_all_single(output: torch.Tensor, input: torch.Tensor) -> Any:
        nbytes = output.nbytes
        o, i = output.data_ptr(), input.data_ptr()
        if choose("all_to_all_single", nbytes, output.dtype).algorithm != "blocking" or (
            o != i and o < i + nbytes and i < o + nbytes
        ):
            # large, or partly overlapping (the method copies the input first)
            return backend.all_to_all_single(output, input, False, timeout=timeout, hints=hints)
        key = (o, i, nbytes, output.dtype)
        spec = specs.get(key)
        if spec is None:
            if len(specs) >= limit:
                specs.clear()
            recv = [fa(o, nbytes), types[key[3]]]  # no count: one block per rank
            send = IN_PLACE if o == i else [fa(i, nbytes), types[key[3]]]
            spec = specs[key] = (send, recv)
        backend._watch = ("all_to_all_single", seconds)
        try:
            Alltoall(spec[0], spec[1])
        finally:
            backend._watch = None
        return None

    return {
        "all_reduce": all_reduce,
        "broadcast": broadcast,
        "all_to_all_single": all_to_all_single,
    }
