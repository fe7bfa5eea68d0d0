"""A device-initiated all_gather (#56): program ``p`` of one Triton kernel puts this rank's
chunk into peer ``p``'s window at this rank's place and signals, then waits for peer ``p``'s
chunk; once every program has returned, the window holds every rank's chunk in rank order.

Run it (on a machine without a GPU the kernel runs under Triton's interpreter)::

    torchrun --standalone --nproc-per-node 4 examples/device_all_gather.py

The result is compared with ``comm.all_gather_single`` on the same input (docs/device.md).
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms.triton import barrier_block, put_block, rank, wait_signal_from  # noqa: E402

#: The signal id a chunk announces itself with.
CHUNK_ARRIVED = 0


@triton.jit
def all_gather_kernel(win, src, chunk_bytes, signal_id, rounds, status):
    p = tl.program_id(0)
    rc = put_block(win, rank(win) * chunk_bytes, src, 0, p, chunk_bytes, signal_id, -1)
    if rc == 0:
        rc = wait_signal_from(win, p, signal_id, rounds)
    tl.store(status + p, rc)


@triton.jit
def barrier_kernel(win, status):
    tl.store(status, barrier_block(win, 0))


class DeviceAllGather:
    """All-gather of ``numel`` elements per rank through a device window."""

    def __init__(self, comm: torchcomms.TorchComm, numel: int, dtype=torch.float32):
        self.comm, self.numel = comm, numel
        n = comm.get_size()
        self.window = comm.new_window(torch.zeros(n * numel, dtype=dtype))
        self.handle = self.window.get_device_window(signal_count=1, counter_count=0)
        self.send = torch.zeros(numel, dtype=dtype)
        self.send_handle = self.window.register_local_buffer(self.send)
        self.rounds = 0

    def __call__(self, chunk: torch.Tensor) -> torch.Tensor:
        """Every rank's ``chunk`` (``numel`` elements), concatenated in rank order."""
        n = self.comm.get_size()
        status = torch.zeros(n, dtype=torch.int32)
        if self.rounds:  # every rank has copied the previous result out
            barrier_kernel[(1,)](self.handle, status)
            self._check(status[:1])
        self.send.copy_(chunk.reshape(-1))
        self.rounds += 1
        all_gather_kernel[(n,)](
            self.handle,
            self.send_handle,
            self.send.numel() * self.send.element_size(),
            CHUNK_ARRIVED,
            self.rounds,
            status,
        )
        self._check(status)
        return self.window.get_tensor().clone()

    def _check(self, status: torch.Tensor) -> None:
        if bool((status != 0).any()):
            self.window.check_device_errors()
            raise RuntimeError(f"all_gather kernel returned {status.tolist()}")

    def close(self) -> None:
        """Release the window (collective)."""
        self.window.deregister_local_buffer(self.send_handle)
        self.window.tensor_deregister()


def main() -> None:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="device_all_gather")
    n, me = comm.get_size(), comm.get_rank()
    gather = DeviceAllGather(comm, numel=1000)
    for step in range(10):
        chunk = torch.randn(1000, generator=torch.Generator().manual_seed(step * n + me))
        got = gather(chunk)
        want = torch.empty(n * 1000)
        comm.all_gather_single(want, chunk, False)
        assert torch.equal(got, want), "device all_gather differs from all_gather_single"
    print(f"rank {me}: 10 device all_gather calls equal all_gather_single")
    gather.close()
    comm.finalize()


if __name__ == "__main__":
    main()
