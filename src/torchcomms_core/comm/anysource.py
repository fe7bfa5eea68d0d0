"""Receive from any source: the optional ``recv_anysource`` capability, through the core.

Backends that can (gloo) implement ``TorchCommBackend.recv_anysource``; ``method_support``
reports it. The call runs like any other receive (checks, hooks with ``src=-1``, timeout,
work status); the sender is known once it completed.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch

from torchcomms_core.comm.tagged import check_tag, require_tags

if TYPE_CHECKING:
    from torchcomms_core.comm.base import CommBase as TorchComm
    from torchcomms_core.foundation.work import TorchWork

#: The ``src`` hooks and flight records see for a receive from any source (c10d's value).
ANY_SOURCE = -1


def recv_anysource(
    comm: TorchComm,
    tensor: torch.Tensor,
    async_op: bool = False,
    *,
    timeout: timedelta | None = None,
    hints: dict[str, str] | None = None,
    tag: int = 0,
) -> tuple[TorchWork, Callable[[], int]]:
    """Receive into ``tensor`` from whichever rank sends first.

    Returns the work and a function that gives the sender's rank once the work is done.
    A nonzero ``tag`` matches only a send under that tag (see ``comm.tagged``).

    Raises:
        NotImplementedError: the communicator's backend cannot receive from any source.
    """
    if comm.method_support().get("recv_anysource") != "native":
        raise NotImplementedError(
            f"recv from any source: backend {comm.get_backend()!r} of communicator "
            f"{comm.get_name()!r} cannot receive from any source; pass the sender's rank "
            f"(src=...)"
        )
    tag = check_tag(tag, "recv")
    require_tags(comm, tag, "recv")
    extra = {"tag": tag} if tag else {}
    call = comm._guard("recv", timeout, hints)
    comm.checker.tensor("recv", "tensor", tensor)
    buf = call.out(tensor)
    issued: list[Any] = []
    sender: list[int] = []

    def issue(
        buf: torch.Tensor,
        async_op: bool,
        *,
        timeout: timedelta | None,
        hints: dict[str, str] | None,
    ) -> Any:
        backend = comm.get_backend_impl()
        work = backend.recv_anysource(buf, async_op, timeout=timeout, hints=hints, **extra)
        issued.append(work)
        return work

    # Read the sender before the core drops the backend's work.
    call.then(lambda: sender.append(issued[0].source_rank()), first=True)
    work = comm._issue(call, (buf,), async_op, (tensor, ANY_SOURCE), issue)

    def source_rank() -> int:
        if not sender:
            raise RuntimeError(
                "recv from any source: the sender is known only once the "
                "receive completed; call wait() first"
            )
        return sender[0]

    return work, source_rank
