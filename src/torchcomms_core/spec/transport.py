"""The spec a transport plugin implements: one-sided writes and reads between registered memory.

``torchcomms._transport`` (``RdmaTransport``, ``RdmaMemory``, their views) checks every
argument, then calls the installed transport through these classes. A plugin subclasses
:class:`TransportProvider` and names the class in the ``torchcomms.transports`` entry-point
group (``nixl = "torchcomms_nixl:NixlTransport"``), as a backend does in ``torchcomms.backends``.
"""

from __future__ import annotations

import abc
from datetime import timedelta
from typing import Any, ClassVar

import torch

__all__ = [
    "RESULT_SUCCESS",
    "TRANSPORT_SPEC_VERSION",
    "MemoryRegistration",
    "RdmaRemoteBuffer",
    "TransportEndpoint",
    "TransportProvider",
]

#: Version of this spec a provider declares in ``spec_version`` (same rules as backends: the
#: same major, a minor no newer than the core's).
TRANSPORT_SPEC_VERSION = "1.1"

#: What ``connect``, ``write`` and ``read`` return when they succeed: the reference's
#: ``commSuccess``. Failures raise an exception that says what went wrong.
RESULT_SUCCESS = 0


class RdmaRemoteBuffer:
    """A peer's registered memory as this process reaches it: ``(ptr, len, access_key)``.

    ``ptr`` is the address in the owner's process, ``len`` the number of bytes, and
    ``access_key`` the transport's key for that memory (from the owner's
    ``RdmaMemory.to_remote_buffer()``). Picklable, so it travels in any message.
    """

    __slots__ = ("ptr", "len", "access_key")

    def __init__(self, ptr: int, len: int, access_key: str) -> None:  # noqa: A002 - reference name
        #: The memory's address in the owner's process.
        self.ptr = ptr
        #: The number of bytes.
        self.len = len
        #: The transport's key for the memory, from the owner's ``to_remote_buffer()``.
        self.access_key = access_key

    def __reduce__(self) -> tuple[Any, ...]:
        return (RdmaRemoteBuffer, (self.ptr, self.len, self.access_key))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RdmaRemoteBuffer):
            return NotImplemented
        return (self.ptr, self.len, self.access_key) == (other.ptr, other.len, other.access_key)

    def __hash__(self) -> int:
        return hash((self.ptr, self.len, self.access_key))

    def __repr__(self) -> str:
        key = self.access_key if len(self.access_key) <= 24 else self.access_key[:21] + "..."
        return f"RdmaRemoteBuffer(ptr={self.ptr:#x}, len={self.len}, access_key={key!r})"


class MemoryRegistration(abc.ABC):
    """A tensor's memory registered with the engine, made by :meth:`TransportProvider.register`.

    The core keeps the tensor alive while the registration lives and checks, before every
    transfer, that its memory has not moved; a provider may cache registrations and say so
    in ``reused``.
    """

    #: Whether this registration reuses one made earlier (covering the same memory).
    reused: bool = False

    @abc.abstractmethod
    def access_key(self) -> str:
        """A key a peer passes back in an ``RdmaRemoteBuffer`` to reach this memory.

        The memory counts as exposed from then on: after :meth:`release`, a peer that still
        holds the key must be refused before any byte moves.
        """

    @abc.abstractmethod
    def release(self, wait: bool = True) -> None:
        """Deregister (idempotent): when the ``RdmaMemory`` is closed, or collected (then
        ``wait`` is False: the provider may finish later, keeping the memory registered and
        alive until no peer can reach it)."""


class TransportEndpoint(abc.ABC):
    """One end of a point-to-point connection (one ``RdmaTransport``).

    ``write``/``read`` move ``nbytes`` between local address ``addr`` (inside ``local``, as
    the core has checked) and ``remote``, blocking until the transfer completed at both
    ends, and raise on failure, on a peer's death, and after ``timeout``. A provider refuses,
    before any byte moves, a remote buffer whose key is not from this endpoint's peer, that
    lies outside the memory the key exposes, or whose memory the peer released.

    Since spec 1.1 an endpoint may also carry *signals*: ``signal`` tells the peer's endpoint
    that this one's transfers so far are done, ``signals`` counts those received. A provider
    that implements them sets ``supports_signals``; windows over the transport then signal
    with one message instead of a counter written into the peer's memory.
    """

    #: Whether ``signal`` and ``signals`` are implemented (spec 1.1).
    supports_signals: ClassVar[bool] = False
    #: The largest ``post_write`` (spec 1.1); 0: not implemented.
    max_post_bytes: ClassVar[int] = 0

    @abc.abstractmethod
    def bind(self) -> bytes:
        """What the peer's ``connect`` needs to reach this endpoint."""

    @abc.abstractmethod
    def connect(self, peer_url: bytes, timeout: timedelta) -> None:
        """Connect to the endpoint whose ``bind()`` gave ``peer_url``; both ends call it."""

    @abc.abstractmethod
    def connected(self) -> bool:
        """Whether ``connect`` has succeeded (and the endpoint is not closed)."""

    @abc.abstractmethod
    def write(
        self,
        local: MemoryRegistration,
        addr: int,
        nbytes: int,
        remote: RdmaRemoteBuffer,
        timeout: timedelta,
    ) -> None:
        """Copy ``nbytes`` at local ``addr`` into ``remote``."""

    @abc.abstractmethod
    def read(
        self,
        local: MemoryRegistration,
        addr: int,
        nbytes: int,
        remote: RdmaRemoteBuffer,
        timeout: timedelta,
    ) -> None:
        """Copy ``nbytes`` of ``remote`` to local ``addr``."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connection (idempotent); later transfers are refused."""

    def signal(self, timeout: timedelta) -> None:
        """Add one to the peer endpoint's count of signals, delivered after every transfer
        this endpoint completed (so the peer sees their bytes once it sees the count); raise
        when the peer cannot be reached, or after ``timeout``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement signals")

    def post_write(
        self, addr: int, nbytes: int, remote: RdmaRemoteBuffer, timeout: timedelta
    ) -> None:
        """Send the ``nbytes`` of host memory at ``addr`` (at most ``max_post_bytes``; the
        core has checked them) to be written into ``remote`` without waiting for them: they
        are in place once the peer has seen a later ``signal`` of this endpoint, or once
        ``flush`` returns. Copy them before returning. The same refusals as ``write``."""
        raise NotImplementedError(f"{type(self).__name__} does not implement posted writes")

    def flush(self, timeout: timedelta) -> None:
        """Return once every ``post_write`` of this endpoint is in the peer's memory."""
        raise NotImplementedError(f"{type(self).__name__} does not implement posted writes")

    def signals(self) -> int:
        """How many signals the peer's endpoint has sent this one, after letting the engine
        take in what has arrived (waiters call it in their poll loop)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement signals")


class TransportProvider(abc.ABC):
    """A transport engine: what the ``torchcomms.transports`` entry point names.

    The core makes one instance per process, on first use, and asks it for endpoints and
    registrations.
    """

    #: The name users select it by (``TORCHCOMM_TRANSPORT``) and ``torchcomms transports`` lists.
    name: ClassVar[str]
    #: The version of this spec the provider implements.
    spec_version: ClassVar[str] = TRANSPORT_SPEC_VERSION
    #: Device types whose memory it registers (``"cpu"``, ``"cuda"``).
    devices: ClassVar[tuple[str, ...]] = ("cpu",)

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """``(True, "ok")`` when it can run here, else ``(False, why)``. Must not raise."""
        return True, "ok"

    @abc.abstractmethod
    def endpoint(self, device: torch.device, timeout: timedelta) -> TransportEndpoint:
        """A new, unconnected endpoint."""

    @abc.abstractmethod
    def register(self, tensor: torch.Tensor) -> MemoryRegistration:
        """Register ``tensor``'s memory (contiguous, on a device type in ``devices``)."""
