"""A device-initiated all_to_all_v in the shape of an expert-parallel dispatch (#56): each
program of one Triton kernel puts this rank's rows for one peer into that peer's window and
signals, then waits for that peer's rows to this rank; once every program has returned,
every peer's rows are here.

On a machine without a GPU the kernel runs under Triton's interpreter (chosen below)::

    torchrun --standalone --nproc-per-node 4 examples/device_all_to_all_v.py

The result is compared with ``comm.all_to_all_v_single`` on the same rows (docs/device.md).
"""

from __future__ import annotations

import os

import torch

# Without a GPU the kernels run on CPU tensors under Triton's interpreter, which must be
# chosen before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import torchcomms  # noqa: E402
from torchcomms.triton import barrier_block, put_block, wait_signal_from  # noqa: E402

#: The signal id a dispatch announces its rows with.
ROWS_ARRIVED = 0


@triton.jit
def dispatch_kernel(
    win, src, row_bytes, send_offsets, send_counts, dst_offsets, signal_id, rounds, status
):
    """Program ``p``: this rank's ``send_counts[p]`` rows from ``send_offsets[p]`` go to peer
    ``p``'s window at row ``dst_offsets[p]``, with a signal; then wait for peer ``p``'s rows."""
    p = tl.program_id(0)
    rows = tl.load(send_counts + p)
    rc = put_block(
        win,
        tl.load(dst_offsets + p) * row_bytes,
        src,
        tl.load(send_offsets + p) * row_bytes,
        p,
        rows * row_bytes,
        signal_id,
        -1,
    )
    if rc == 0:
        rc = wait_signal_from(win, p, signal_id, rounds)
    tl.store(status + p, rc)


@triton.jit
def barrier_kernel(win, status):
    """Every rank has read the previous dispatch out of its window."""
    tl.store(status, barrier_block(win, 0))


class DeviceAllToAllV:
    """All-to-all-v of rows of ``hidden`` elements through a device window.

    Args:
        comm: a communicator whose backend has windows (gloo, shm, mpi).
        max_rows: the most rows one rank sends, and receives, per call.
        hidden: elements per row; ``dtype``: their type.
    """

    def __init__(self, comm: torchcomms.TorchComm, max_rows: int, hidden: int, dtype=torch.float32):
        self.comm, self.max_rows, self.hidden = comm, max_rows, hidden
        self.window = comm.new_window(torch.zeros(max_rows * hidden, dtype=dtype))
        self.handle = self.window.get_device_window(signal_count=1, counter_count=0)
        self.send = torch.zeros(max_rows * hidden, dtype=dtype)
        self.send_handle = self.window.register_local_buffer(self.send)
        self.row_bytes = hidden * self.send.element_size()
        self.rounds = 0

    def __call__(
        self, rows: torch.Tensor, split_sizes: list[int]
    ) -> tuple[torch.Tensor, list[int]]:
        """Send ``split_sizes[p]`` consecutive rows of ``rows`` to each peer ``p``; returns the
        rows received (in rank order) and how many came from each peer."""
        comm, n, me = self.comm, self.comm.get_size(), self.comm.get_rank()
        status = torch.zeros(n, dtype=torch.int32)
        if self.rounds:  # the previous result has been copied out everywhere
            barrier_kernel[(1,)](self.handle, status)
            self._check(status[:1], "barrier")
        # The layout step: every rank learns every rank's split sizes.
        counts = torch.tensor(split_sizes, dtype=torch.int64)
        matrix = torch.zeros(n * n, dtype=torch.int64)
        comm.all_gather_single(matrix, counts, False)
        matrix = matrix.view(n, n)  # matrix[s, p]: rows from s to p
        dst_offsets = matrix[:me].sum(0)  # where this rank's rows start in each peer's window
        received = matrix[:, me].tolist()
        if sum(received) > self.max_rows or sum(split_sizes) > self.max_rows:
            raise ValueError(f"more than max_rows={self.max_rows} rows to send or receive")
        self.send[: rows.numel()].copy_(rows.reshape(-1))
        send_offsets = torch.cumsum(counts, 0) - counts
        self.rounds += 1
        dispatch_kernel[(n,)](
            self.handle,
            self.send_handle,
            self.row_bytes,
            send_offsets,
            counts,
            dst_offsets,
            ROWS_ARRIVED,
            self.rounds,
            status,
        )
        self._check(status, "dispatch")
        out = self.window.get_tensor()[: sum(received) * self.hidden].clone()
        return out.view(-1, self.hidden), received

    def _check(self, status: torch.Tensor, what: str) -> None:
        if bool((status != 0).any()):
            self.window.check_device_errors()  # raises, naming window, peer and signal
            raise RuntimeError(f"{what} kernel returned {status.tolist()}")

    def close(self) -> None:
        """Release the window (collective)."""
        self.window.deregister_local_buffer(self.send_handle)
        self.window.tensor_deregister()


def main() -> None:
    comm = torchcomms.new_comm("gloo", torch.device("cpu"), name="device_a2av")
    n, me, hidden = comm.get_size(), comm.get_rank(), 8
    gen = torch.Generator().manual_seed(me)
    a2a = DeviceAllToAllV(comm, max_rows=16 * n, hidden=hidden)
    for _ in range(20):
        splits = torch.randint(0, 16, (n,), generator=gen).tolist()
        rows = torch.randn(sum(splits), hidden, generator=gen)
        got, received = a2a(rows, splits)
        want = torch.empty(sum(received), hidden)
        comm.all_to_all_v_single(want, rows, received, splits, False)
        assert torch.equal(got, want), "device all_to_all_v differs from all_to_all_v_single"
    print(f"rank {me}: 20 device all_to_all_v calls equal all_to_all_v_single")
    a2a.close()
    comm.finalize()


if __name__ == "__main__":
    main()
