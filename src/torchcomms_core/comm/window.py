"""One-sided windows: ``TorchCommWindow`` and the contract of a backend's window engine.

The core owns what every backend would otherwise rewrite: argument and range checks (before
anything is written), the registered tensor, outstanding-work tracking, hooks and
``TorchWork``. A backend's ``new_window()`` returns a :class:`WindowEngine` doing the
engine-specific steps (MPI RMA, shared memory, ...).
"""

from __future__ import annotations

import copy
import itertools
import weakref
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.device.window import DeviceWindow, resolve_counts
from torchcomms_core.foundation.errors import CommInputError, CommStateError, CommTypeError
from torchcomms_core.foundation.work import TorchWork, WorkStatus
from torchcomms_core.spec import TorchCommWinAccessType, WindowEngine
from torchcomms_core.spec.window import DeviceSide

if TYPE_CHECKING:
    from torchcomms_core.comm.base import CommBase as TorchComm

__all__ = [
    "TorchCommWinAccessType",
    "TorchCommWindow",
    "TorchCommWindowAttr",
    "WindowEngine",
]


class TorchCommWindowAttr:
    """Attributes of a window as seen from one peer (``access_type``)."""

    __slots__ = ("access_type",)

    def __init__(
        self,
        access_type: TorchCommWinAccessType = (TorchCommWinAccessType.WIN_ACCESS_TYPE_SEPARATE),
    ) -> None:
        #: How this rank reaches the peer's window, ``WIN_ACCESS_TYPE_UNIFIED`` (direct
        #: loads and stores, ``map_remote_tensor`` works) or ``WIN_ACCESS_TYPE_SEPARATE``
        #: (through the engine only, with ``put``).
        self.access_type = access_type

    def __repr__(self) -> str:
        return f"TorchCommWindowAttr(access_type={self.access_type.name})"


class TorchCommWindow:
    """A buffer that peers write into with ``put`` and synchronise on with signals.

    Created by ``comm.new_window(tensor=None)``; ``tensor_register`` binds the buffer
    (every rank, collectively). A typical exchange::

        win = comm.new_window(torch.zeros(n))
        win.put(data, dst_rank=peer, target_offset_nelems=0, async_op=False)
        win.signal(peer, async_op=False)          # data is visible at peer first
        win.wait_signal(peer, async_op=False)     # then read win.get_tensor()
    """

    #: Numbers the windows of this process, for the names errors give them.
    _ids = itertools.count(1)

    def __init__(self, comm: TorchComm, engine: WindowEngine, name: str = "window") -> None:
        self._comm = comm
        self._engine = engine
        self._tensor: torch.Tensor | None = None
        self._owning = True
        self._meta: tuple[torch.dtype, list[int], torch.device] | None = None
        self._numels: list[int] = []
        self._nbytes = 0
        #: Asynchronous works issued on the window, kept until they complete.
        self._works: list[TorchWork] = []
        self._mapped: list[weakref.ref[torch.Tensor]] = []
        self._name = name
        #: The device side, from ``get_device_window`` until the tensor is deregistered.
        self._device: DeviceSide | None = None
        self._device_hooks: tuple[RemovableHandle, ...] = ()

    # -- buffer ----------------------------------------------------------------------

    def tensor_register(self, tensor: torch.Tensor, owning: bool = True) -> None:
        """Bind ``tensor`` as this rank's window buffer (collective).

        ``tensor`` must be contiguous and on the communicator's device. With
        ``owning=False`` the window keeps no reference and ``get_tensor()`` returns None.

        Raises:
            CommStateError: a tensor is already registered.
            CommInputError / CommTypeError: the tensor is unsuitable.
        """
        where = "tensor_register"
        self._usable(where)
        if self._meta is not None:
            raise CommStateError(
                f"{where}: this window already has a registered tensor; call "
                f"tensor_deregister() first"
            )
        if not isinstance(tensor, torch.Tensor):
            raise CommTypeError(
                f"{where}: tensor must be a torch.Tensor, got {type(tensor).__name__}"
            )
        if not tensor.is_contiguous():
            raise CommInputError(
                f"{where}: the window buffer must be contiguous; pass "
                f"tensor.contiguous() and keep that tensor"
            )
        self._comm.checker.tensor(where, "tensor", tensor)
        numels = list(self._engine.register(tensor))
        self._meta = (tensor.dtype, list(tensor.shape), tensor.device)
        self._numels = numels
        self._nbytes = tensor.numel() * tensor.element_size()
        self._owning = bool(owning)
        self._tensor = tensor if owning else None

    def tensor_deregister(self) -> None:
        """Release the buffer (collective). Refused while puts or signals are in flight or
        tensors from ``map_remote_tensor`` are alive."""
        where = "tensor_deregister"
        self._usable(where)
        if self._meta is None:
            raise CommStateError(f"{where}: no tensor is registered with this window")
        busy = self._outstanding()
        if busy:
            raise CommStateError(
                f"{where}: the window is in use by {busy} unfinished put/signal/wait_signal "
                f"work(s); call wait() on them before deregistering"
            )
        mapped = sum(1 for ref in self._mapped if ref() is not None)
        if mapped:
            raise CommStateError(
                f"{where}: {mapped} tensor(s) from map_remote_tensor() still reference peers' "
                f"buffers; drop them (del) before deregistering"
            )
        self._close_device(collective=True)
        self._engine.deregister()
        self._meta = None
        self._tensor = None
        self._numels = []
        self._nbytes = 0
        self._works.clear()
        self._mapped.clear()

    def get_size(self) -> int:
        """Bytes of this rank's registered buffer (0 when none is)."""
        return self._nbytes

    def get_tensor(self) -> torch.Tensor | None:
        """The registered tensor; ``None`` if none is, or it was registered ``owning=False``."""
        return self._tensor

    @property
    def dtype(self) -> torch.dtype | None:
        """The registered tensor's dtype; ``None`` while no tensor is registered."""
        return self._meta[0] if self._meta else None

    @property
    def shape(self) -> list[int]:
        """The registered tensor's shape (a new list); ``[]`` while no tensor is registered."""
        return list(self._meta[1]) if self._meta else []

    @property
    def device(self) -> torch.device | None:
        """The registered tensor's device; ``None`` while no tensor is registered."""
        return self._meta[2] if self._meta else None

    # -- one-sided operations --------------------------------------------------------

    def put(
        self,
        tensor: torch.Tensor,
        dst_rank: int,
        target_offset_nelems: int,
        async_op: bool,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Write ``tensor`` into ``dst_rank``'s buffer at element ``target_offset_nelems``.

        The target does not take part. Everything is checked before anything is written:
        dtype, device, rank, and that the whole tensor fits in the target's buffer.
        """
        where = "put"
        meta = self._bound(where)
        c = self._comm.checker
        c.tensor(where, "tensor", tensor)
        dst = c.peer(where, "dst_rank", dst_rank)
        if tensor.dtype != meta[0]:
            raise CommInputError(
                f"{where}: tensor has dtype {tensor.dtype} but the window holds {meta[0]}"
            )
        if isinstance(target_offset_nelems, bool) or not isinstance(target_offset_nelems, int):
            raise CommTypeError(
                f"{where}: target_offset_nelems must be an int, got {target_offset_nelems!r}"
            )
        limit = self._numels[dst]
        n = tensor.numel()
        if target_offset_nelems < 0 or target_offset_nelems + n > limit:
            raise CommInputError(
                f"{where}: {n} element(s) at target_offset_nelems={target_offset_nelems} do not "
                f"fit in rank {dst}'s window of {limit} element(s); need 0 <= offset and "
                f"offset + tensor.numel() <= {limit}"
            )
        src = tensor if tensor.is_contiguous() else tensor.contiguous()
        timeout = self._timeout(timeout)
        inner = self._engine.put(src, dst, target_offset_nelems, async_op, timeout)
        return self._work("put", inner, async_op)

    def signal(
        self,
        peer_rank: int,
        async_op: bool,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Tell ``peer_rank`` that this rank's earlier puts to it are visible there."""
        self._bound("signal")
        peer = self._comm.checker.peer("signal", "peer_rank", peer_rank)
        inner = self._engine.signal(peer, async_op, self._timeout(timeout))
        return self._work("signal", inner, async_op)

    def wait_signal(
        self,
        peer_rank: int,
        async_op: bool,
        hints: dict[str, str] | None = None,
        timeout: timedelta | None = None,
    ) -> TorchWork:
        """Wait for one ``signal`` from ``peer_rank`` (each signal is consumed once)."""
        self._bound("wait_signal")
        peer = self._comm.checker.peer("wait_signal", "peer_rank", peer_rank)
        inner = self._engine.wait_signal(peer, async_op, self._timeout(timeout))
        return self._work("wait_signal", inner, async_op)

    def get_attr(self, peer_rank: int) -> TorchCommWindowAttr:
        """How this rank reaches ``peer_rank``'s window, as a :class:`TorchCommWindowAttr`.

        Its ``access_type`` says whether :meth:`map_remote_tensor` works for that peer
        (``WIN_ACCESS_TYPE_UNIFIED``) or only :meth:`put` does (``WIN_ACCESS_TYPE_SEPARATE``).

        Args:
            peer_rank: the peer, in the communicator's numbering (this rank included).

        Raises:
            CommTypeError: ``peer_rank`` is not an int.
            CommInputError: ``peer_rank`` is out of range for the communicator.
        """
        peer = self._comm.checker.peer("get_attr", "peer_rank", peer_rank)
        return TorchCommWindowAttr(self._engine.access_type(peer))

    def map_remote_tensor(self, rank: int) -> torch.Tensor:
        """A tensor viewing ``rank``'s buffer directly (UNIFIED access only)."""
        meta = self._bound("map_remote_tensor")
        peer = self._comm.checker.peer("map_remote_tensor", "rank", rank)
        if self._engine.access_type(peer) is not TorchCommWinAccessType.WIN_ACCESS_TYPE_UNIFIED:
            raise CommStateError(
                f"map_remote_tensor: rank {peer}'s window is not directly addressable from this "
                f"rank on backend {self._comm.get_backend()!r} (access type SEPARATE); use put()"
            )
        view = self._engine.map_remote(peer)
        if self._numels[peer] == torch.Size(meta[1]).numel():
            view = view.view(meta[1])  # same size as ours: give it our shape
        self._mapped.append(weakref.ref(view))
        return view

    # -- device-side handles (kernels) -----------------------------------------------------

    def get_device_window(
        self, signal_count: int = -1, counter_count: int = -1, barrier_count: int = 1
    ) -> int:
        """The handle a Triton kernel passes to ``torchcomms.triton``'s device functions.

        Collective (every rank calls it, with the same counts) the first time; later calls
        return the same handle. The window's puts, signals and barriers from kernels are
        carried out by a proxy thread over this window's own engine (docs/device.md).

        Args:
            signal_count: signal ids per peer (``-1``: one per rank).
            counter_count: local completion counters (``-1``: one per rank).
            barrier_count: barrier ids.

        Raises:
            CommStateError: no tensor is registered, the window is not on the CPU, or the
                handle exists with other counts.
            CommInputError / CommTypeError: a count is out of range.
        """
        where = "get_device_window"
        meta = self._bound(where)
        counts = resolve_counts(signal_count, counter_count, barrier_count, self._comm.get_size())
        device = self._device
        if device is not None:
            if device.counts != counts:
                raise CommStateError(
                    f"{where}: this window's device handle has (signal, counter, barrier) "
                    f"counts {device.counts}, not {counts}; one handle per window"
                )
            return device.handle
        timeout = self._comm.get_timeout()
        native = getattr(self._engine, "device_window", None)
        if native is not None:  # the backend's own device path (spec: DeviceSide)
            device = native(counts, timeout)
        else:
            device = self._proxied(meta, counts, timeout)
        self._device = device
        # Abort wakes every waiting kernel; the communicator's end stops the proxy before
        # the backend tears the engines down under it.
        self._device_hooks = (
            self._comm.register_abort_hook(device.abort),
            self._comm._on_ending(device.abort),
        )
        return device.handle

    def _proxied(
        self,
        meta: tuple[torch.dtype, list[int], torch.device],
        counts: tuple[int, int, int],
        timeout: timedelta,
    ) -> DeviceSide:
        """The core's device side: a command ring drained by a proxy over this engine."""
        if meta[2].type != "cpu":
            raise CommStateError(
                f"get_device_window: the core's proxy serves windows on the CPU; this one is "
                f"on {meta[2]} and backend {self._comm.get_backend()!r} declares no native "
                f"device path"
            )
        element = torch.empty((), dtype=meta[0]).element_size()
        tensor = self._tensor
        return DeviceWindow(
            self._name,
            self._comm.get_rank(),
            self._comm.get_size(),
            self._engine,
            self._comm.get_backend_impl().new_window(),
            meta[0],
            [n * element for n in self._numels],
            tensor.data_ptr() if tensor is not None else 0,
            counts,
            timeout,
        )

    def register_local_buffer(self, tensor: torch.Tensor) -> int:
        """A source handle for ``tensor`` that kernels pass to ``put_block`` (not collective;
        after :meth:`get_device_window`). The tensor stays referenced until
        :meth:`deregister_local_buffer`."""
        return self._device_side("register_local_buffer").register_buffer(tensor)

    def deregister_local_buffer(self, handle: int) -> None:
        """Forget a handle from :meth:`register_local_buffer`, after the puts already queued
        from it are done."""
        self._device_side("deregister_local_buffer").deregister_buffer(handle)

    def check_device_errors(self) -> None:
        """Raise the first failure kernels met on this window (a negative code they returned),
        naming the window, the peer and the signal or counter id; then forget it.

        Raises:
            CommTimeoutError: a wait ran past the communicator's timeout, or the ring stayed
                full.
            CommStateError: the window (its communicator) was aborted while a kernel waited.
            CommOperationError: the proxy failed carrying out a command (a peer is gone).
            CommInputError: a call was refused before anything was queued.
        """
        device = self._device
        if device is None:
            return
        error = device.failure()
        if error is not None:
            device.clear_failure()
            raise error

    def _device_side(self, where: str) -> DeviceSide:
        self._bound(where)
        if self._device is None:
            raise CommStateError(f"{where}: call window.get_device_window() (on every rank) first")
        return self._device

    def _close_device(self, collective: bool) -> None:
        device, self._device = self._device, None
        if device is None:
            return
        for hook in self._device_hooks:
            hook.remove()
        self._device_hooks = ()
        device.close(collective)

    # -- copies ----------------------------------------------------------------------

    def __copy__(self) -> TorchCommWindow:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> TorchCommWindow:
        """A new window (collective) with a clone of the registered buffer, if any."""
        clone: TorchCommWindow = self._comm.new_window()
        memo[id(self)] = clone
        if self._tensor is not None:
            clone.tensor_register(copy.deepcopy(self._tensor, memo), self._owning)
        return clone

    def __repr__(self) -> str:
        if self._meta is None:
            return "<TorchCommWindow unbound>"
        dtype, shape, device = self._meta
        return f"<TorchCommWindow {dtype} {tuple(shape)} on {device}>"

    # -- helpers ---------------------------------------------------------------------

    def _usable(self, where: str) -> None:
        self._comm._check_usable(f"window {where}")

    def _bound(self, where: str) -> tuple[torch.dtype, list[int], torch.device]:
        self._usable(where)
        meta = self._meta
        if meta is None:
            raise CommStateError(
                f"{where}: the window has no registered tensor; call "
                f"window.tensor_register(tensor) on every rank first"
            )
        return meta

    def _timeout(self, timeout: timedelta | None) -> timedelta:
        if timeout is None:
            return self._comm.get_timeout()
        if not isinstance(timeout, timedelta) or timeout <= timedelta(0):
            raise CommTypeError(
                f"window: timeout must be a positive datetime.timedelta, got {timeout!r}"
            )
        return timeout

    def _work(self, op: str, inner: Any, async_op: bool) -> TorchWork:
        work = TorchWork(inner, None, self._comm, op)
        if inner is None:
            return work
        if not async_op:
            work.wait()
            return work
        self._works = [w for w in self._works if w.status is WorkStatus.INPROGRESS]
        self._works.append(work)
        return work

    def _outstanding(self) -> int:
        return sum(1 for work in self._works if not work.is_completed())

    def _release(self) -> None:
        """Free the engine without the collective handshake (communicator going away)."""
        self._close_device(collective=False)
        self._engine.free(abort=True)


def create_window(comm: TorchComm, tensor: torch.Tensor | None) -> TorchCommWindow:
    """``comm.new_window(tensor)``: build the window (hooks run as for ``new_window``)."""
    support = comm.method_support().get("new_window")
    if support != "native":
        raise CommStateError(
            f"new_window: backend {comm.get_backend()!r} does not support one-sided windows; "
            f"use a backend that does (mpi; gloo, across hosts with torchcomms-nixl)"
        )
    args = comm._hooks_before("new_window", ())
    engine = comm.get_backend_impl().new_window()
    window = TorchCommWindow(comm, engine, f"{comm.get_name()}/window{next(TorchCommWindow._ids)}")
    if tensor is not None:
        window.tensor_register(tensor)
    comm._hooks_after(args)
    return window
