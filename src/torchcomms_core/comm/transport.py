"""The reference's transport API (``RdmaTransport``, ``RdmaMemory``, views, remote buffers),
checked here and carried out by the transport plugin installed (``torchcomms.transports``).

Everything a user can get wrong is refused in this module before the plugin is called: views
outside their memory, sizes that differ, a tensor whose memory moved after registration, an
unconnected transport. Without a transport plugin, ``RdmaTransport.supported()`` is False and
the constructors raise an error that says what to install. Which plugin serves the process
is the plugin host's business (:mod:`torchcomms_core.plugin_host.transports`); its
registration functions are re-exported here, where ``torchcomms._transport`` has them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommInputError, CommStateError, CommTypeError
from torchcomms_core.operations.validation import check_timeout
from torchcomms_core.plugin_host.transports import (
    TRANSPORTS_GROUP,
    TransportNotFoundError,
    available_transports,
    describe_transports,
    register_transport,
    unregister_transport,
)
from torchcomms_core.plugin_host.transports import provider as _provider
from torchcomms_core.plugin_host.transports import provider_class as _provider_class
from torchcomms_core.spec.transport import (
    RESULT_SUCCESS,
    MemoryRegistration,
    RdmaRemoteBuffer,
    TransportEndpoint,
)

__all__ = [
    "TRANSPORTS_GROUP",
    "RdmaMemory",
    "RdmaMemoryMutableView",
    "RdmaMemoryView",
    "RdmaRemoteBuffer",
    "RdmaTransport",
    "TransportNotFoundError",
    "attach_rdma_memory_hook",
    "available_transports",
    "describe_transports",
    "register_transport",
    "unregister_transport",
]


def _timeout(value: Any, where: str, default: timedelta) -> timedelta:
    """``value`` checked as every timeout of the core is, or ``default`` when it is None."""
    return default if value is None else check_timeout(value, where)


# -- registered memory and its views -----------------------------------------------------


def _byte_range(where: str, offset: Any, length: Any, nbytes: int) -> tuple[int, int]:
    for name, value in (("offset", offset), ("length", length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CommTypeError(f"{where}: {name} must be an int (bytes) or None, got {value!r}")
    start = 0 if offset is None else offset
    size = nbytes - start if length is None else length
    if start < 0 or size < 0 or start + size > nbytes:
        raise CommInputError(
            f"{where}: a view of {size} byte(s) at offset {start} does not fit in the "
            f"registered {nbytes} byte(s); need 0 <= offset and offset + length <= {nbytes}"
        )
    return start, size


class RdmaMemory:
    """A tensor's memory, registered with the transport so peers can write and read it.

    The tensor must be contiguous, strided and on a device the transport registers
    (``cpu``; ``cuda`` where the transport supports it). The memory stays registered, and
    the tensor alive, until ``close()`` or until this object and every view of it are gone.
    Offsets and lengths of views are in bytes.

    Raises:
        CommTypeError / CommInputError: the tensor is unsuitable.
        TransportNotFoundError: no transport is installed (a ``CommStateError``).
        CommStateError: the transport cannot run here.
    """

    def __init__(self, tensor: torch.Tensor, /) -> None:
        where = "RdmaMemory"
        self._registration: MemoryRegistration | None = None
        provider = _provider(where)
        if not isinstance(tensor, torch.Tensor):
            raise CommTypeError(f"{where}: expected a torch.Tensor, got {type(tensor).__name__}")
        if tensor.layout != torch.strided or tensor.is_nested:
            raise CommInputError(
                f"{where}: the tensor must be a dense (strided) tensor, got layout {tensor.layout}"
            )
        if not tensor.is_contiguous():
            raise CommInputError(
                f"{where}: the tensor must be contiguous (its bytes are registered as one "
                f"range); pass tensor.contiguous() and keep that tensor"
            )
        if tensor.is_neg() or tensor.is_conj():
            raise CommInputError(
                f"{where}: the tensor holds a lazy negation or conjugation, so its memory does "
                f"not hold its values; pass tensor.resolve_neg().resolve_conj()"
            )
        if tensor.device.type not in provider.devices:
            raise CommInputError(
                f"{where}: transport {provider.name!r} registers "
                f"{', '.join(provider.devices)} memory, not {tensor.device.type}"
            )
        nbytes = tensor.numel() * tensor.element_size()
        if nbytes == 0:
            raise CommInputError(f"{where}: the tensor has no bytes to register (numel() == 0)")
        self._tensor = tensor
        self._storage = tensor.untyped_storage()
        self._storage_ptr = self._storage.data_ptr()
        self._storage_nbytes = self._storage.nbytes()
        self._ptr = tensor.data_ptr()
        self._nbytes = nbytes
        self._registration = provider.register(tensor)

    def to_view(self, offset: int | None = None, length: int | None = None) -> RdmaMemoryView:
        """A read-only view of ``length`` bytes at ``offset`` (defaults: the whole memory)."""
        start, size = _byte_range("to_view", offset, length, self._nbytes)
        self._usable("to_view")
        return RdmaMemoryView(self, start, size)

    def to_mutable_view(
        self, offset: int | None = None, length: int | None = None
    ) -> RdmaMemoryMutableView:
        """A writable view (what ``read`` fills) of ``length`` bytes at ``offset``."""
        start, size = _byte_range("to_mutable_view", offset, length, self._nbytes)
        self._usable("to_mutable_view")
        return RdmaMemoryMutableView(self, start, size)

    def to_remote_buffer(self) -> RdmaRemoteBuffer:
        """What a peer needs to write or read this memory; send it to the peer (picklable)."""
        registration = self._usable("to_remote_buffer")
        return RdmaRemoteBuffer(self._ptr, self._nbytes, registration.access_key())

    def reused_registration(self) -> bool:
        """Whether the transport reused an earlier registration of this memory."""
        return bool(self._usable("reused_registration").reused)

    def size(self) -> int:
        """Bytes registered."""
        return self._nbytes

    def close(self) -> None:
        """Deregister now (idempotent). Returns once peers holding this memory's remote
        buffer are refused (or known dead); views of it can no longer be used."""
        registration, self._registration = self._registration, None
        if registration is not None:
            registration.release(wait=True)

    def __del__(self) -> None:
        registration, self._registration = getattr(self, "_registration", None), None
        if registration is not None:
            try:
                registration.release(wait=False)
            except Exception:  # never raise from a finaliser (interpreter shutdown, ...)
                pass

    def __repr__(self) -> str:
        state = "closed" if self._registration is None else f"{self._nbytes} bytes"
        return f"RdmaMemory({state} at {getattr(self, '_ptr', 0):#x})"

    def _usable(self, where: str) -> MemoryRegistration:
        """The registration, after checking the memory is still the tensor's and registered."""
        registration = self._registration
        if registration is None:
            raise CommStateError(f"{where}: this RdmaMemory was closed; register the tensor again")
        storage = self._storage
        if (
            storage.data_ptr() != self._storage_ptr
            or storage.nbytes() < self._storage_nbytes
            or self._tensor.data_ptr() != self._ptr
            or self._tensor.untyped_storage().data_ptr() != self._storage_ptr
        ):
            raise CommStateError(
                f"{where}: the registered tensor's memory was freed or moved after "
                f"registration (its storage was resized or replaced, e.g. by resize_() or "
                f"set_()); nothing was transferred. Make a new RdmaMemory for the tensor"
            )
        return registration


class RdmaMemoryView:
    """``length`` bytes at ``offset`` of an :class:`RdmaMemory`; the source of ``write``."""

    __slots__ = ("_memory", "_offset", "_length")

    def __init__(self, memory: RdmaMemory, offset: int, length: int) -> None:
        self._memory, self._offset, self._length = memory, offset, length

    def size(self) -> int:
        """Bytes in the view."""
        return self._length

    @property
    def offset(self) -> int:
        """Where the view starts in its memory, in bytes."""
        return self._offset

    def __repr__(self) -> str:
        return f"{type(self).__name__}(offset={self._offset}, size={self._length})"


class RdmaMemoryMutableView(RdmaMemoryView):
    """A view ``read`` may fill; also usable as the source of ``write``."""

    __slots__ = ()


# -- the endpoint -----------------------------------------------------------------------


class RdmaTransport:
    """A point-to-point endpoint for one-sided ``write``/``read`` between registered memory.

    Each side makes one, sends ``bind()`` to the other (through any channel: a store, a
    communicator, a file) and calls ``connect()`` with what it received; both ends must
    connect. ``write`` and ``read`` then move bytes without the peer taking part, blocking
    until done. Calls fail, never hang: a dead peer or an expired ``timeout`` (keyword,
    default ``TORCHCOMM_TIMEOUT_SECONDS``) raises.

    Example::

        t = RdmaTransport(torch.device("cpu"))
        peer_url = exchange(t.bind())           # e.g. through a TCPStore
        t.connect(peer_url)
        mem = RdmaMemory(weights)
        remote = exchange(mem.to_remote_buffer())  # the peer's buffer, pickled
        t.write(mem.to_view(), remote)
    """

    def __init__(self, device: torch.device | str, /, *, timeout: timedelta | None = None) -> None:
        where = "RdmaTransport"
        self._endpoint: TransportEndpoint | None = None
        provider = _provider(where)
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise CommTypeError(f"{where}: invalid device {device!r}: {exc}") from None
        if dev.type not in provider.devices:
            raise CommInputError(
                f"{where}: transport {provider.name!r} runs on {', '.join(provider.devices)} "
                f"devices, not {dev.type!r}"
            )
        self._device = dev
        self._timeout = _timeout(timeout, where, _env.default_timeout())
        self._endpoint = provider.endpoint(dev, self._timeout)

    @staticmethod
    def supported() -> bool:
        """Whether a transport is installed and can run on this machine (starts nothing)."""
        try:
            _provider_class("RdmaTransport.supported")
        except Exception:
            return False
        return True

    def bind(self) -> bytes:
        """This endpoint's address: what the peer passes to ``connect``."""
        return self._open("bind").bind()

    def connect(self, peer_url: bytes, /) -> int:
        """Connect to the peer whose ``bind()`` returned ``peer_url``; 0 on success.

        Waits (up to the timeout) until the peer has connected to this endpoint too.
        """
        where = "connect"
        endpoint = self._open(where)
        if isinstance(peer_url, (bytearray, memoryview)):
            peer_url = bytes(peer_url)
        if not isinstance(peer_url, bytes) or not peer_url:
            raise CommTypeError(
                f"{where}: peer_url must be the non-empty bytes of the peer's bind(), got "
                f"{type(peer_url).__name__}"
            )
        if endpoint.connected():
            raise CommStateError(
                f"{where}: this RdmaTransport is already connected; make one RdmaTransport per peer"
            )
        endpoint.connect(peer_url, self._timeout)
        return RESULT_SUCCESS

    def connected(self) -> bool:
        """Whether ``connect`` has succeeded (and the transport is not closed)."""
        return self._endpoint is not None and self._endpoint.connected()

    def write(
        self,
        local_buffer: RdmaMemoryView,
        remote_buffer: RdmaRemoteBuffer,
        /,
        *,
        timeout: timedelta | None = None,
    ) -> int:
        """Copy ``local_buffer`` into the peer's ``remote_buffer``; 0 when done.

        The sizes must be equal. Nothing moves when any argument is refused.
        """
        return self._transfer("write", local_buffer, remote_buffer, timeout)

    def read(
        self,
        local_buffer: RdmaMemoryMutableView,
        remote_buffer: RdmaRemoteBuffer,
        /,
        *,
        timeout: timedelta | None = None,
    ) -> int:
        """Copy the peer's ``remote_buffer`` into ``local_buffer`` (a mutable view); 0 when done."""
        return self._transfer("read", local_buffer, remote_buffer, timeout)

    def supports_signals(self) -> bool:
        """Whether this transport carries ``signal``/``signals`` (a torchcomms extension)."""
        return bool(self._open("supports_signals").supports_signals)

    def signal(self, *, timeout: timedelta | None = None) -> int:
        """Tell the peer that this endpoint's transfers so far are done; 0 when sent.

        A torchcomms extension (the reference has no completion message): the peer's
        ``signals()`` grows by one, and a peer that sees it also sees every byte this
        endpoint wrote before the call. Use it after ``write`` to say "the data is there"
        without a second channel.
        """
        where = "signal"
        endpoint = self._signalling(where)
        endpoint.signal(_timeout(timeout, where, self._timeout))
        return RESULT_SUCCESS

    def max_post_bytes(self) -> int:
        """The largest ``post_write`` this transport carries (0: none; a torchcomms extension)."""
        return int(self._open("max_post_bytes").max_post_bytes)

    def post_write(
        self,
        data: torch.Tensor,
        remote_buffer: RdmaRemoteBuffer,
        /,
        *,
        timeout: timedelta | None = None,
    ) -> int:
        """Send a small tensor's bytes into the peer's ``remote_buffer`` without waiting for
        them to land; 0 when sent (a torchcomms extension).

        They are in place once the peer has seen a later ``signal()`` of this transport, or
        once ``flush()`` returns: one trip, where ``write`` waits for the peer's
        acknowledgement. ``data`` is copied before the call returns, so the caller may
        reuse it. At most ``max_post_bytes()`` bytes, host memory on both sides; the sizes
        must be equal; nothing is sent when an argument is refused.
        """
        where = "post_write"
        endpoint = self._signalling(where)
        limit = int(endpoint.max_post_bytes)
        if limit <= 0:
            raise CommStateError(
                f"{where}: the installed transport does not carry posted writes; use write() "
                f"(check max_post_bytes() first)"
            )
        if not isinstance(data, torch.Tensor):
            raise CommTypeError(f"{where}: data must be a torch.Tensor, got {type(data).__name__}")
        if not data.is_cpu:
            raise CommInputError(
                f"{where}: data is on {data.device}; posted writes carry host memory (use write)"
            )
        if not isinstance(remote_buffer, RdmaRemoteBuffer):
            raise CommTypeError(
                f"{where}: remote_buffer must be an RdmaRemoteBuffer (the peer's "
                f"RdmaMemory.to_remote_buffer()), got {type(remote_buffer).__name__}"
            )
        nbytes = data.numel() * data.element_size()
        if nbytes > limit:
            raise CommInputError(
                f"{where}: {nbytes} bytes is more than the {limit} a posted write carries; use "
                f"write() for larger transfers"
            )
        if remote_buffer.len != nbytes:
            raise CommInputError(
                f"{where}: the remote buffer holds {remote_buffer.len} byte(s) but data "
                f"{nbytes}; they must be equal"
            )
        if not data.is_contiguous():
            data = data.contiguous()
        seconds = self._timeout if timeout is None else _timeout(timeout, where, self._timeout)
        # The endpoint copies the bytes before it returns; ``data`` is alive until then.
        endpoint.post_write(data.data_ptr(), nbytes, remote_buffer, seconds)
        return RESULT_SUCCESS

    def flush(self, *, timeout: timedelta | None = None) -> int:
        """Return (0) once every ``post_write`` of this transport is in the peer's memory."""
        where = "flush"
        endpoint = self._signalling(where)
        if int(endpoint.max_post_bytes) > 0:
            endpoint.flush(_timeout(timeout, where, self._timeout))
        return RESULT_SUCCESS

    def signals(self) -> int:
        """How many times the peer has called ``signal()`` on its end so far (a torchcomms
        extension; poll it to wait for the peer)."""
        return self._signalling("signals").signals()

    def _signalling(self, where: str) -> TransportEndpoint:
        endpoint = self._open(where)
        if not endpoint.supports_signals:
            raise CommStateError(
                f"{where}: the installed transport does not carry signals; write a flag into "
                f"the peer's memory instead (check supports_signals() first)"
            )
        if not endpoint.connected():
            raise CommStateError(
                f"{where}: this RdmaTransport is not connected; call connect() with the peer's "
                f"bind() first (on both sides)"
            )
        return endpoint

    def close(self) -> None:
        """Release the connection (idempotent)."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is not None:
            endpoint.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _open(self, where: str) -> TransportEndpoint:
        if self._endpoint is None:
            raise CommStateError(f"{where}: this RdmaTransport was closed; make a new one")
        return self._endpoint

    def _transfer(self, where: str, view: Any, remote: Any, timeout: timedelta | None) -> int:
        endpoint = self._open(where)
        wanted = RdmaMemoryMutableView if where == "read" else RdmaMemoryView
        if not isinstance(view, wanted):
            how = "to_mutable_view()" if where == "read" else "to_view()"
            raise CommTypeError(
                f"{where}: local_buffer must be an {wanted.__name__} (RdmaMemory.{how}), got "
                f"{type(view).__name__}"
            )
        if not isinstance(remote, RdmaRemoteBuffer):
            raise CommTypeError(
                f"{where}: remote_buffer must be an RdmaRemoteBuffer (the peer's "
                f"RdmaMemory.to_remote_buffer()), got {type(remote).__name__}"
            )
        for name in ("ptr", "len"):
            value = getattr(remote, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CommInputError(
                    f"{where}: remote_buffer.{name} must be a non-negative int, got {value!r}"
                )
        if not isinstance(remote.access_key, str):
            raise CommTypeError(
                f"{where}: remote_buffer.access_key must be a str, got "
                f"{type(remote.access_key).__name__}"
            )
        if not endpoint.connected():
            raise CommStateError(
                f"{where}: this RdmaTransport is not connected; call connect() with the peer's "
                f"bind() first (on both sides)"
            )
        if remote.len != view.size():
            raise CommInputError(
                f"{where}: the remote buffer holds {remote.len} byte(s) but the local view "
                f"{view.size()}; they must be equal (narrow the local side with "
                f"to_view(offset, length), the remote side with RdmaRemoteBuffer(ptr + offset, "
                f"length, access_key))"
            )
        memory = view._memory
        registration = memory._usable(where)
        if view.size() == 0:
            return RESULT_SUCCESS
        seconds = _timeout(timeout, where, self._timeout)
        move = endpoint.read if where == "read" else endpoint.write
        move(registration, memory._ptr + view.offset, view.size(), remote, seconds)
        return RESULT_SUCCESS


def attach_rdma_memory_hook(reg: Any, dereg: Any) -> None:
    """The reference's caching-allocator registration hook; not needed here.

    Each ``RdmaMemory`` registers its tensor and the transport caches registrations, so
    there is no allocator hook to install.
    """
    raise CommStateError(
        "attach_rdma_memory_hook: torchcomms registers memory per RdmaMemory (the transport "
        "caches registrations, see RdmaMemory.reused_registration()); there is no caching-"
        "allocator hook to attach. Make an RdmaMemory for the tensors you transfer"
    )
