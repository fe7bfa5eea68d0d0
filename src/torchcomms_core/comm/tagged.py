"""Sends and receives matched by tag: the optional ``send_tagged``/``recv_tagged``
capability, through the core.

c10d's ``send``/``recv``/``isend``/``irecv`` take a ``tag``; on gloo only a receive with
the sender's tag matches a send, so two messages between the same ranks can be received
in another order than they were sent. The bridge and distwrap pass the tag here. Tag 0 is
the plain operation on every backend; a nonzero tag needs a backend that offers the
capability (``method_support`` reports it) and is refused elsewhere, never dropped: a
dropped tag would match messages by order and silently swap their contents.

The call runs as the plain send or receive does (checks, hooks under the name ``send`` or
``recv``, timeout, work status).
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

import torch

from torchcomms_core.comm.call import _in
from torchcomms_core.foundation.errors import CommInputError, CommTypeError

if TYPE_CHECKING:
    from torchcomms_core.comm.base import CommBase as TorchComm
    from torchcomms_core.foundation.work import TorchWork

#: The largest tag accepted: c10d passes tags as a C ``int``.
MAX_TAG = 2**31 - 1


def check_tag(tag: Any, what: str) -> int:
    """``tag`` as an int in ``0..MAX_TAG``, else a clear error naming ``what``."""
    try:
        value = operator.index(tag)
    except TypeError:
        raise CommTypeError(f"{what}: tag must be an int, got {tag!r}") from None
    if not 0 <= value <= MAX_TAG:
        raise CommInputError(f"{what}: tag={value} is out of range; pass 0..{MAX_TAG}")
    return value


def supports_tags(comm: TorchComm) -> bool:
    """Whether the communicator's backend matches point-to-point messages by tag."""
    support = comm.method_support()
    return support.get("send_tagged") == "native" and support.get("recv_tagged") == "native"


def require_tags(comm: TorchComm, tag: int, what: str) -> None:
    """Refuse a nonzero ``tag`` on a backend that cannot match by tag."""
    if tag and not supports_tags(comm):
        raise NotImplementedError(
            f"{what}: tag={tag}: backend {comm.get_backend()!r} of communicator "
            f"{comm.get_name()!r} cannot match messages by tag (its messages between two "
            f"ranks match in the order they are posted), and dropping the tag could "
            f"deliver a message to the wrong receive; pass tag=0 and post sends and "
            f"receives in the same order, or use a backend that matches by tag (gloo, mpi, shm)"
        )


def send(
    comm: TorchComm,
    tensor: torch.Tensor,
    dst: int,
    tag: int,
    async_op: bool = False,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
) -> TorchWork:
    """Send ``tensor`` to ``dst`` under ``tag`` (tag 0: the plain ``comm.send``).

    Raises:
        NotImplementedError: a nonzero tag on a backend that cannot match by tag.
    """
    return _tagged(comm, "send", "dst", tensor, dst, tag, async_op, timeout, hints)


def recv(
    comm: TorchComm,
    tensor: torch.Tensor,
    src: int,
    tag: int,
    async_op: bool = False,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
) -> TorchWork:
    """Receive into ``tensor`` what ``src`` sent under ``tag`` (tag 0: ``comm.recv``).

    Raises:
        NotImplementedError: a nonzero tag on a backend that cannot match by tag.
    """
    return _tagged(comm, "recv", "src", tensor, src, tag, async_op, timeout, hints)


def _tagged(
    comm: TorchComm,
    op: str,
    peer_arg: str,
    tensor: torch.Tensor,
    peer: int,
    tag: int,
    async_op: bool,
    timeout: timedelta | None,
    hints: dict[str, str] | None,
) -> TorchWork:
    """``send`` or ``recv`` (``op``) under ``tag``, checked and issued as the plain one."""
    tag = check_tag(tag, op)
    if not tag:  # the plain operation (``TorchComm.send``/``recv``, a layer above this module)
        plain: TorchWork = getattr(cast(Any, comm), op)(tensor, peer, async_op, hints, timeout)
        return plain
    require_tags(comm, tag, op)
    call = comm._guard(op, timeout, hints)
    comm.checker.tensor(op, "tensor", tensor)
    peer = comm.checker.peer(op, peer_arg, peer, allow_self=comm._self_p2p)
    buf = _in(tensor) if op == "send" else call.out(tensor)
    method = _with_tag(getattr(comm.get_backend_impl(), f"{op}_tagged"), tag)
    return comm._issue(call, (buf, peer), async_op, (tensor, peer), method)


def _with_tag(method: Callable[..., Any], tag: int) -> Callable[..., Any]:
    """``method`` (``send_tagged``/``recv_tagged``) called as the plain op is by ``_issue``."""

    def issue(
        buf: torch.Tensor,
        peer: int,
        async_op: bool,
        *,
        timeout: timedelta | None,
        hints: dict[str, str] | None,
    ) -> Any:
        return method(buf, peer, tag, async_op, timeout=timeout, hints=hints)

    return issue
