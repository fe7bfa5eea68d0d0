"""The notifications this plugin's agents send each other: their prefixes and framing.

Every message starts with ``TAG``; ``hello``, ``wake``, ``flush``/``flushed`` and
``revoke``/``revoked`` are JSON after it, signals and posted writes have their own framing
(they are the fast path). Owns the wire format only; imports nothing of the plugin.

``hello``
    sent by ``connect`` once the peer's metadata is loaded; ``connect`` returns when the
    peer's hello for this endpoint arrived, so both agents can notify each other. It carries
    the sender's live exposures and the next exposure number: a key older than the
    connection is valid only if it was live then.
``s<endpoint>`` (a signal)
    one more signal to that endpoint of this agent (``RdmaTransport.signal``), sent once the
    sender's transfers before it completed; counted when read. Waiters read notifications
    themselves (``progress``), so a signal is seen as soon as it arrives rather than at the
    service thread's next poll.
``wake``
    sent by a transfer to a target that has not heard from this process for half a second:
    the target's service thread then polls every ``TORCHCOMM_NIXL_PROGRESS_US`` for a
    second (the agent runs without NIXL's progress thread, and a target over TCP takes part
    in every transfer), and every 2 ms once traffic stops.
``p`` + exposure + address + bytes (a posted write)
    ``RdmaTransport.post_write``: bytes for memory this agent exposed, which it copies in
    when it reads the message, after checking that the exposure is live and the bytes lie
    inside it (else the message is dropped). Notifications between two agents arrive in
    order, so a signal sent after a posted write is read after it: the peer that sees the
    signal sees the bytes. Over TCP this is one trip where a write is a round trip (UCX
    completes a write once the target acknowledged it). Host memory only.
``flush`` / ``flushed``
    ``RdmaTransport.flush``: answered once every earlier message was handled, so every
    posted write before it is in place.
``revoke`` / ``revoked``
    releasing memory a peer may hold a key to sends ``revoke`` to every connected agent and
    deregisters only once each answered ``revoked`` (or died, or the timeout passed). A
    peer marks the exposure revoked under the lock its transfers hold while they run, so
    after its answer no transfer into that memory is running or can start: NIXL itself
    would let a stale key write into memory that was deregistered and reused.
"""

from __future__ import annotations

import json
import struct
from typing import Any

#: Prefix of this plugin's notifications (other NIXL users of the agent are ignored).
TAG = b"torchcomms-nixl/1 "
#: Prefix of a signal: the receiving endpoint's number follows in decimal (the one message
#: on a fast path, so neither JSON nor the protocol's dispatch).
SIGNAL = b"torchcomms-nixl/1 s"
#: Prefix of a posted write: the exposure and the address (two little-endian int64), then
#: the bytes to write there.
POST = b"torchcomms-nixl/1 p"
POST_HEADER = struct.Struct("<qq")
#: The largest posted write (a notification carries it whole).
MAX_POST_BYTES = 64 << 10


def encode(body: dict[str, Any]) -> bytes:
    """The notification carrying the JSON ``body`` (a ``hello``, ``revoke``, ...)."""
    return TAG + json.dumps(body, separators=(",", ":")).encode("ascii")


def decode(message: bytes) -> dict[str, Any]:
    """The JSON body of a notification :func:`encode` made (it starts with ``TAG``); an
    empty dict, which names no kind and is ignored, for a message that is not one."""
    try:
        body = json.loads(message[len(TAG) :])
    except (ValueError, RecursionError):
        return {}
    return body if isinstance(body, dict) else {}
