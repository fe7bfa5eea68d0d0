"""An in-process backend whose ranks are threads exchanging tensors through queues.

It implements only the spec's required primitives, so every other operation runs on
the spec's portable defaults: the unit tests use it to check those derivations.
"""

from __future__ import annotations

import queue
import threading
from datetime import timedelta
from typing import Any

import torch

from torchcomms_core import CommOptions, TorchCommBackend
from torchcomms_core.comm.operations import TorchComm


class _Fabric:
    """The shared medium of one thread group: a FIFO per (src, dst) pair."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.links = {(s, d): queue.Queue() for s in range(size) for d in range(size)}


class _RecvWork:
    def __init__(self, link: queue.Queue, tensor: torch.Tensor, timeout: timedelta) -> None:
        self._link, self._tensor, self._timeout = link, tensor, timeout
        self._done = False

    def wait(self) -> bool:
        if not self._done:
            try:
                payload = self._link.get(timeout=self._timeout.total_seconds())
            except queue.Empty:
                raise TimeoutError(f"recv timed out after {self._timeout}") from None
            if payload.numel() != self._tensor.numel():
                raise RuntimeError(
                    f"message of {payload.numel()} elements for a buffer of {self._tensor.numel()}"
                )
            self._tensor.view(-1).copy_(payload.view(-1))
            self._done = True
        return True


class MemoryBackend(TorchCommBackend):
    """Required primitives only: send, recv, lifecycle, identity."""

    allows_self_p2p = False  # its sends wait for the receive

    def __init__(self, fabric: _Fabric | None = None, rank: int = 0) -> None:
        self._fabric = fabric
        self._rank = rank
        self.sent_bytes = 0

    def init(self, device: torch.device, name: str, options: CommOptions) -> None:
        if self._fabric is None:
            raise RuntimeError("MemoryBackend is created by make_group() or split()")

    def split(self, ranks: list[int], name: str, options: CommOptions) -> MemoryBackend | None:
        if not ranks:
            return None
        key = (id(self._fabric), name, tuple(ranks))
        with _fabric_lock:
            fabric = _fabrics.setdefault(key, _Fabric(len(ranks)))
        child = MemoryBackend(fabric, options.rank)
        child._bind(self.device, name, options)
        child.init(self.device, name, options)
        return child

    def finalize(self) -> None:
        self._fabric = None

    def get_rank(self) -> int:
        return self._rank

    def get_size(self) -> int:
        return self._fabric.size if self._fabric else 0

    def get_backend_name(self) -> str:
        return "memory"

    def get_comm_name(self) -> str:
        return self.comm_name

    def send(
        self,
        tensor: torch.Tensor,
        dst: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        self.sent_bytes += tensor.numel() * tensor.element_size()
        self._fabric.links[(self._rank, dst)].put(tensor.detach().clone())
        return None

    def recv(
        self,
        tensor: torch.Tensor,
        src: int,
        async_op: bool,
        *,
        timeout: timedelta | None = None,
        hints: dict[str, str] | None = None,
    ) -> Any:
        work = _RecvWork(
            self._fabric.links[(src, self._rank)], tensor, timeout or timedelta(seconds=10)
        )
        if async_op:
            return work
        work.wait()
        return None


_fabric_lock = threading.Lock()
_fabrics: dict[tuple, _Fabric] = {}


def make_group(size: int, name: str = "mem", timeout_s: float = 10) -> list[TorchComm]:
    """Create ``size`` communicators over one in-memory fabric (use one thread per rank)."""
    from torch.distributed import HashStore

    fabric = _Fabric(size)
    store = HashStore()
    comms = []
    for rank in range(size):
        backend = MemoryBackend(fabric, rank)
        opts = CommOptions(
            timeout=timedelta(seconds=timeout_s),
            store=store,
            abort_process_on_timeout_or_error=False,
            name=name,
            rank=rank,
            size=size,
        )
        backend._bind(torch.device("cpu"), name, opts)
        backend.init(torch.device("cpu"), name, opts)
        comms.append(TorchComm(backend, torch.device("cpu"), name, opts, opts.store))
    return comms


def run_threads(comms: list[TorchComm], fn: Any, timeout: float = 30) -> list[Any]:
    """Run ``fn(comm)`` for every rank in its own thread; return results, re-raise errors."""
    results: list[Any] = [None] * len(comms)
    errors: list[BaseException | None] = [None] * len(comms)

    def body(i: int) -> None:
        try:
            results[i] = fn(comms[i])
        except BaseException as exc:  # collected and re-raised in the caller
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError("a rank thread did not finish")
    for err in errors:
        if err is not None:
            raise err
    return results
