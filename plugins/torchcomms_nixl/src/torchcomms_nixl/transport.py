"""``NixlTransport``: the core's transport spec on NIXL agents (UCX: shared memory, TCP, RDMA).

An endpoint's ``bind()`` is the agent's connection metadata; ``connect()`` loads the peer's
and waits for the peer to connect back; ``write``/``read`` are NIXL ``WRITE``/``READ``
transfers polled to completion. Registrations are cached per process (see ``agent``).
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

import torch

from torchcomms_core.plugin import (
    CommStateError,
    MemoryRegistration,
    RdmaRemoteBuffer,
    TransportEndpoint,
    TransportProvider,
)

from . import engine
from .agent import Agent, agent
from .keys import Address, decode_address, encode_address
from .records import Region
from .wire import MAX_POST_BYTES


class NixlRegistration(MemoryRegistration):
    """One ``RdmaMemory``'s share of a NIXL registration, and its exposure once it has a key."""

    def __init__(self, owner: Agent, region: Region, reused: bool, base: int, nbytes: int) -> None:
        self._agent = owner
        self._region: Region | None = region
        self.reused = reused
        self._base, self._nbytes = base, nbytes
        self._exposure: int | None = None
        self._key: str | None = None

    @property
    def region(self) -> Region:
        if self._region is None:
            raise CommStateError("this RdmaMemory was closed; register the tensor again")
        return self._region

    def access_key(self) -> str:
        if self._key is None:
            self._exposure, self._key = self._agent.expose(self.region, self._base, self._nbytes)
        return self._key

    def release(self, wait: bool = True) -> None:
        region, self._region = self._region, None
        if region is not None:
            self._agent.release(region, self._exposure, wait)


class NixlEndpoint(TransportEndpoint):
    """One ``RdmaTransport`` on this process's agent."""

    supports_signals = True
    max_post_bytes = MAX_POST_BYTES

    def __init__(self, owner: Agent) -> None:
        self._agent = owner
        self._id = owner.new_endpoint_id()
        self._peer: Address | None = None
        self._closed = False

    def bind(self) -> bytes:
        self._open("bind")
        return encode_address(
            Address(self._agent.name, self._id, self._agent.connection_metadata())
        )

    def connect(self, peer_url: bytes, timeout: timedelta) -> None:
        self._open("connect")
        peer = decode_address(peer_url)
        self._agent.connect(self._id, peer, timeout)
        self._peer = peer

    def connected(self) -> bool:
        return self._peer is not None and not self._closed

    def write(
        self,
        local: MemoryRegistration,
        addr: int,
        nbytes: int,
        remote: RdmaRemoteBuffer,
        timeout: timedelta,
    ) -> None:
        self._move("WRITE", local, addr, nbytes, remote, timeout)

    def read(
        self,
        local: MemoryRegistration,
        addr: int,
        nbytes: int,
        remote: RdmaRemoteBuffer,
        timeout: timedelta,
    ) -> None:
        self._move("READ", local, addr, nbytes, remote, timeout)

    def signal(self, timeout: timedelta) -> None:
        self._agent.signal(self._connected_peer("signal"))

    def post_write(
        self, addr: int, nbytes: int, remote: RdmaRemoteBuffer, timeout: timedelta
    ) -> None:
        self._agent.post_write(self._connected_peer("post_write").agent, addr, nbytes, remote)

    def flush(self, timeout: timedelta) -> None:
        self._agent.flush(self._connected_peer("flush").agent, timeout)

    def _connected_peer(self, where: str) -> Address:
        self._open(where)
        if self._peer is None:
            raise CommStateError(f"{where}: this RdmaTransport is not connected; call connect()")
        return self._peer

    def signals(self) -> int:
        self._open("signals")
        return self._agent.signals(self._id)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._agent.disconnect(self._id)

    def _open(self, where: str) -> None:
        if self._closed:
            raise CommStateError(f"{where}: this RdmaTransport was closed; make a new one")

    def _move(
        self,
        op: str,
        local: MemoryRegistration,
        addr: int,
        nbytes: int,
        remote: RdmaRemoteBuffer,
        timeout: timedelta,
    ) -> None:
        where = op.lower()
        peer = self._connected_peer(where)
        if not isinstance(local, NixlRegistration):
            raise CommStateError(f"{where}: the local memory was not registered by NIXL")
        self._agent.transfer(op, peer.agent, local.region, addr, nbytes, remote, timeout)


class NixlTransport(TransportProvider):
    """The ``nixl`` transport: NIXL agents over UCX, host memory (and CUDA memory with a CUDA
    build of torch and UCX)."""

    name: ClassVar[str] = "nixl"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda")

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        reason = engine.unavailable_reason()
        return (False, reason) if reason else (True, "ok")

    def endpoint(self, device: torch.device, timeout: timedelta) -> TransportEndpoint:
        owner = agent()
        owner.revocation_timeout_s = max(owner.revocation_timeout_s, timeout.total_seconds())
        return NixlEndpoint(owner)

    def register(self, tensor: torch.Tensor) -> MemoryRegistration:
        owner = agent()
        region, reused = owner.register(tensor)
        return NixlRegistration(
            owner, region, reused, tensor.data_ptr(), tensor.numel() * tensor.element_size()
        )
