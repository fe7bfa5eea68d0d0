"""What travels between peers: an endpoint's address (``bind()``) and a memory's access key.

Both are versioned JSON: the address carries the NIXL agent's name, the endpoint's number
and the agent's connection metadata; the key names the agent, the exposure (one per
``to_remote_buffer``), the bytes it covers and the NIXL metadata of the registration.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from torchcomms_core.plugin import CommInputError

URL_PREFIX = b"torchcomms-nixl/1 "
KEY_PREFIX = "nixl1:"


@dataclasses.dataclass(frozen=True)
class Address:
    """A peer endpoint: its agent, its number there, and the agent's connection metadata."""

    agent: str
    endpoint: int
    metadata: bytes


@dataclasses.dataclass(frozen=True)
class Key:
    """An exposure of registered memory: ``nbytes`` at ``base`` in agent ``agent``."""

    agent: str
    exposure: int
    base: int
    nbytes: int
    mem_type: str
    device_id: int
    metadata: bytes


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def encode_address(address: Address) -> bytes:
    body = {"agent": address.agent, "endpoint": address.endpoint, "md": _b64(address.metadata)}
    return URL_PREFIX + json.dumps(body, separators=(",", ":")).encode("ascii")


def decode_address(url: bytes) -> Address:
    """The address in ``url``; a clear error when it is not a torchcomms-nixl ``bind()``."""
    if not url.startswith(URL_PREFIX):
        raise CommInputError(
            f"connect: peer_url is not the bind() of a torchcomms-nixl RdmaTransport (it starts "
            f"with {url[:24]!r}); pass the bytes the peer's bind() returned, unchanged"
        )
    try:
        body: dict[str, Any] = json.loads(url[len(URL_PREFIX) :])
        return Address(str(body["agent"]), int(body["endpoint"]), base64.b64decode(body["md"]))
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise CommInputError(
            f"connect: peer_url is damaged ({type(exc).__name__}: {exc}); pass the bytes the "
            f"peer's bind() returned, unchanged"
        ) from None


def encode_key(key: Key) -> str:
    body = {
        "a": key.agent,
        "e": key.exposure,
        "b": key.base,
        "n": key.nbytes,
        "m": key.mem_type,
        "d": key.device_id,
        "md": _b64(key.metadata),
    }
    raw = json.dumps(body, separators=(",", ":")).encode("ascii")
    return KEY_PREFIX + base64.urlsafe_b64encode(raw).decode("ascii")


def decode_key(where: str, text: str) -> Key:
    """The key in an ``RdmaRemoteBuffer.access_key``; a clear error when it is not one."""
    if not text.startswith(KEY_PREFIX):
        raise CommInputError(
            f"{where}: remote_buffer.access_key is not a torchcomms-nixl key; use the "
            f"RdmaRemoteBuffer the peer's RdmaMemory.to_remote_buffer() returned"
        )
    try:
        body: dict[str, Any] = json.loads(base64.urlsafe_b64decode(text[len(KEY_PREFIX) :]))
        return Key(
            agent=str(body["a"]),
            exposure=int(body["e"]),
            base=int(body["b"]),
            nbytes=int(body["n"]),
            mem_type=str(body["m"]),
            device_id=int(body["d"]),
            metadata=base64.b64decode(body["md"]),
        )
    except (ValueError, KeyError, TypeError, OverflowError, RecursionError) as exc:
        raise CommInputError(
            f"{where}: remote_buffer.access_key is damaged ({type(exc).__name__}: {exc}); use "
            f"the RdmaRemoteBuffer the peer's RdmaMemory.to_remote_buffer() returned"
        ) from None
