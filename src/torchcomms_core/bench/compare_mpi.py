"""``--compare mpi4py``: the same operations as raw mpi4py calls on the same tensors.

:class:`Mpi4pyCalls` offers the ``torch.distributed`` functions the bench operations call
(``all_reduce``, ``broadcast``, ...), each one blocking mpi4py call on NumPy views of the
tensors, as a user of mpi4py writes them. It runs on its own duplicate of
``MPI.COMM_WORLD``, so its calls never match ours.
"""

from __future__ import annotations

import types
from typing import Any

import torch

from torchcomms_core.bench.base import BenchOp
from torchcomms_core.bench.data import Case

#: The mpi4py method each comparable bench operation (by name) becomes.
MPI_FUNCTIONS: dict[str, str] = {
    "all_reduce": "Allreduce",
    "reduce": "Reduce",
    "reduce_scatter_single": "Reduce_scatter_block",
    "all_gather_single": "Allgather",
    "all_to_all_single": "Alltoall",
    "broadcast": "Bcast",
    "barrier": "Barrier",
    "send_recv": "Send/Recv",
}


def check_backend(backend: str) -> None:
    """Raise ``ValueError`` unless ``backend`` runs on MPI (what mpi4py compares with)."""
    if backend != "mpi":
        raise ValueError(
            f"--compare mpi4py compares the mpi backend with raw mpi4py calls; "
            f"run it with --backend mpi under mpiexec, not --backend {backend}"
        )


class Mpi4pyCalls:
    """Raw mpi4py stand-ins for the ``torch.distributed`` calls of the bench operations."""

    def __init__(self, case: Case) -> None:
        from mpi4py import MPI

        self._MPI = MPI
        self._comm = MPI.COMM_WORLD.Dup()
        self._n = self._comm.Get_size()
        # NumPy views of the bench buffers, made once per tensor: a raw mpi4py program
        # holds its arrays rather than converting them on every call.
        # Keyed by a tensor's id, or ("scratch", id) for _scratch's copies.
        self._views: dict[int | tuple[str, int], tuple[torch.Tensor, Any]] = {}
        ops = {
            "sum": MPI.SUM,
            "prod": MPI.PROD,
            "min": MPI.MIN,
            "max": MPI.MAX,
            "avg": MPI.SUM,
        }  # MPI has no average: sum, then divide (see all_reduce)
        self.ReduceOp = types.SimpleNamespace(
            SUM=ops["sum"], PRODUCT=ops["prod"], MIN=ops["min"], MAX=ops["max"], AVG=_AVG
        )
        self._avg_case = case.redop == "avg"

    def refuses(self, op: BenchOp, case: Case) -> str | None:
        """Why ``op`` has no raw mpi4py counterpart here, or ``None``."""
        if op.name not in MPI_FUNCTIONS:
            return "not compared with mpi4py"
        if case.dtype == torch.bfloat16:
            return "mpi4py has no bfloat16 type"
        return None

    def describe(self, op: BenchOp) -> str:
        return f"mpi4py MPI.Comm.{MPI_FUNCTIONS[op.name]} on its own communicator"

    def close(self) -> None:
        self._comm.Free()

    def _np(self, t: torch.Tensor) -> Any:
        hit = self._views.get(id(t))
        if hit is None or hit[0] is not t:
            hit = self._views[id(t)] = (t, t.numpy())
        return hit[1]

    def _op(self, op: Any) -> Any:
        return self._MPI.SUM if op is _AVG else op

    # -- the torch.distributed functions the operations call ----------------------------

    def all_reduce(self, tensor: torch.Tensor, op: Any) -> None:
        a = self._np(tensor)
        self._comm.Allreduce(self._MPI.IN_PLACE, a, self._op(op))
        if op is _AVG:
            a /= self._n

    def reduce(self, tensor: torch.Tensor, dst: int, op: Any) -> None:
        a = self._np(tensor)
        if self._comm.Get_rank() == dst:
            self._comm.Reduce(self._MPI.IN_PLACE, a, self._op(op), dst)
            if op is _AVG:
                a /= self._n
        else:
            self._comm.Reduce(a, None, self._op(op), dst)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, op: Any) -> None:
        if _overlap(output, input):
            # MPI refuses aliased buffers; mpi4py users pass a separate output.
            input = self._scratch(input)
        self._comm.Reduce_scatter_block(self._np(input), self._np(output), self._op(op))
        if op is _AVG:
            self._np(output)[...] /= self._n

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor) -> None:
        if _overlap(output, input):
            self._comm.Allgather(self._MPI.IN_PLACE, self._np(output))
        else:
            self._comm.Allgather(self._np(input), self._np(output))

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: Any = None,
        input_split_sizes: Any = None,
    ) -> None:
        self._comm.Alltoall(self._np(input), self._np(output))

    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self._comm.Bcast(self._np(tensor), src)

    def barrier(self) -> None:
        self._comm.Barrier()

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._comm.Send(self._np(tensor), dst)

    def recv(self, tensor: torch.Tensor, src: int) -> None:
        self._comm.Recv(self._np(tensor), src)

    def _scratch(self, like: torch.Tensor) -> torch.Tensor:
        key = ("scratch", id(like))
        hit = self._views.get(key)
        if hit is None or hit[0].numel() != like.numel():
            copy = like.clone()
            hit = self._views[key] = (copy, copy.numpy())
        hit[0].copy_(like)
        return hit[0]


_AVG = object()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.numel() or not b.numel():
        return False
    a0, b0 = a.data_ptr(), b.data_ptr()
    return a0 < b0 + b.nbytes and b0 < a0 + a.nbytes
