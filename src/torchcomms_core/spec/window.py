"""The one-sided window contract: what a backend's ``new_window()`` returns.

:class:`WindowEngine` is the protocol the core's ``TorchCommWindow`` drives;
:class:`TorchCommWinAccessType` says how a rank reaches a peer's window memory;
:class:`DeviceSide` is what an engine with a native device path gives kernels (#56).

Imports: ``torch`` only.
"""

from __future__ import annotations

import enum
from datetime import timedelta
from typing import Any, Protocol

import torch


class TorchCommWinAccessType(enum.IntEnum):
    """How a rank reaches a peer's window memory."""

    #: Direct loads and stores (same host shared memory, NVLink), so ``map_remote_tensor`` works.
    WIN_ACCESS_TYPE_UNIFIED = 0
    #: Through the engine only (network RMA).
    WIN_ACCESS_TYPE_SEPARATE = 1


class DeviceSide(Protocol):
    """A window's device side: the handle kernels take, and the host's view of it.

    The core's proxy (``torchcomms_core.device.window.DeviceWindow``) is one; an engine with
    a native device path (GIN, NVSHMEM) returns its own from an optional
    ``device_window(counts, timeout)`` method, and the core then uses it instead of the
    proxy. The handle must work with the device functions kernels call on it.
    """

    #: The value ``get_device_window`` returns; ``counts`` are the resolved
    #: ``(signal_count, counter_count, barrier_count)``.
    handle: int
    counts: tuple[int, int, int]

    def register_buffer(self, tensor: torch.Tensor) -> int:
        """A source handle for ``put_block`` (``register_local_buffer``)."""

    def deregister_buffer(self, handle: int) -> None:
        """Forget a source handle (``deregister_local_buffer``)."""

    def failure(self) -> Exception | None:
        """The first failure kernels met, as the exception the host raises; ``None`` if none."""

    def clear_failure(self) -> None:
        """Forget the failure :meth:`failure` reported."""

    def abort(self) -> None:
        """Wake every waiting kernel with a negative code; return once none reads the window."""

    def close(self, collective: bool) -> None:
        """Release the device side (collective unless the communicator is going away)."""


class WindowEngine(Protocol):
    """What a backend's ``new_window()`` returns. Offsets and counts are in elements.

    ``register`` and ``deregister`` are collective. ``put``/``signal``/``wait_signal``
    return ``None`` when done or an object with ``wait()``; the core has checked every
    argument. ``signal(peer)`` must make earlier puts to ``peer`` visible before the
    peer's ``wait_signal`` returns.
    """

    def register(self, tensor: torch.Tensor) -> list[int]:
        """Expose ``tensor`` (contiguous); return every rank's element count."""

    def deregister(self) -> None:
        """Withdraw the registered tensor (collective: every rank calls it).

        No ``put`` to this window follows until the next ``register``.
        """

    def put(
        self, tensor: torch.Tensor, dst_rank: int, offset: int, async_op: bool, timeout: timedelta
    ) -> Any:
        """Write ``tensor`` into ``dst_rank``'s registered tensor, starting at element ``offset``.

        Args:
            tensor: contiguous data of the window's dtype; the core has checked it fits.
            dst_rank: the destination rank (may be this rank).
            offset: the first element written in the destination's registered tensor.
            async_op: return a work instead of completing before returning.
            timeout: the deadline for this call.

        Returns:
            ``None`` when the write is done, or an object with ``wait()``.

        Raises:
            The engine's error when the write fails or does not finish within ``timeout``.
        """

    def signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        """Tell ``peer_rank`` that this rank's earlier puts to it are visible there.

        Args:
            peer_rank: the rank signalled.
            async_op: return a work instead of completing before returning.
            timeout: the deadline for this call.

        Returns:
            ``None`` when sent, or an object with ``wait()``.

        Raises:
            The engine's error when the signal cannot be delivered within ``timeout``.
        """

    def wait_signal(self, peer_rank: int, async_op: bool, timeout: timedelta) -> Any:
        """Wait for one ``signal`` from ``peer_rank``; each signal is consumed by one wait.

        Args:
            peer_rank: the rank whose signal is awaited.
            async_op: return a work instead of waiting before returning.
            timeout: how long to wait for the signal.

        Returns:
            ``None`` once the signal arrived, or an object with ``wait()``.

        Raises:
            The engine's error when no signal arrives within ``timeout``.
        """

    def access_type(self, peer_rank: int) -> TorchCommWinAccessType:
        """How this rank reaches ``peer_rank``'s registered tensor.

        ``WIN_ACCESS_TYPE_UNIFIED`` promises that :meth:`map_remote` works for that peer.
        """

    def map_remote(self, rank: int) -> torch.Tensor:
        """``rank``'s registered tensor as a flat tensor this process can load from and store to.

        Called by the core only for peers whose :meth:`access_type` is ``WIN_ACCESS_TYPE_UNIFIED``.
        """

    def free(self, abort: bool = False) -> None:
        """Release the engine and the memory it registered.

        Args:
            abort: ``True`` when the communicator is going away (after an error or ``abort()``):
                release without the collective handshake with the peers.
        """
