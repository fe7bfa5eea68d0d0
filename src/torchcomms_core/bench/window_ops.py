"""``window_put``: one-sided put + signal between ranks 0 and 1, timed like send_recv.

Rank 0 puts its buffer into rank 1's window and signals; rank 1 waits for the signal and
puts the data back the same way. A timed call is that round trip; the reported time is
one put + signal as the receiving side's ``wait_signal`` sees it.
"""

from __future__ import annotations

from typing import Any

from torchcomms_core.bench.base import PairOp
from torchcomms_core.bench.data import Buffers, Case


class WindowPutSignal(PairOp):
    """``window.put`` then ``window.signal``; the peer's ``wait_signal`` ends the leg."""

    name = "window_put"
    c10d_name = None

    def __init__(self) -> None:
        # The window of each output buffer, made by the first (collective) run on it; the
        # previous size's window is released first, on every rank in the same order.
        self._windows: dict[int, tuple[Any, Any]] = {}

    def _window(self, comm: Any, bufs: Buffers) -> Any:
        found = self._windows.get(id(bufs.output))
        if found is not None and found[0] is bufs.output:
            return found[1]
        for _tensor, old in self._windows.values():
            comm.barrier()  # the peer's last put has landed
            old.tensor_deregister()
        self._windows.clear()
        window = comm.new_window(bufs.output)
        self._windows[id(bufs.output)] = (bufs.output, window)
        return window

    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        win = self._window(comm, bufs)
        if case.rank == 0:
            win.put(bufs.input, 1, 0, False)
            win.signal(1, False)
            win.wait_signal(1, False)
        elif case.rank == 1:
            win.wait_signal(0, False)
            win.put(bufs.output, 0, 0, False)
            win.signal(0, False)
