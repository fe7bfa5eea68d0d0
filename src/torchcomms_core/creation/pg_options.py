"""The hints a group's ``pg_options`` give a torchcomms backend.

c10d hands ``pg_options`` (of ``init_process_group``/``new_group``) to the backend that
builds the group: through a registered backend's creator, through the wrapper's
``split_group``, or, under torch 2.14's switch, as ``_new_process_group_helper``'s
``backend_options`` (it passes ``new_comm`` only their attributes flattened into strings).
Every route reads them here, so they mean the same whichever built the group.
"""

from __future__ import annotations

from typing import Any

from torch._C import _distributed_c10d as _c10d

from torchcomms_core.foundation.errors import CommInputError, CommTypeError

__all__ = ["hints_from_pg_options"]


def hints_from_pg_options(backend: str, pg_options: Any) -> dict[str, str]:
    """The hints ``pg_options`` (of ``init_process_group``/``new_group``) give a torchcomms
    backend: ``None`` gives none; a ``dict`` of hints (``{"arena_bytes": "1048576"}``) is
    taken as is; c10d's gloo options are accepted and give none (their timeout is
    overridden by the ``timeout`` argument in c10d too, which does reach the
    communicator), unless they choose gloo devices, which torchcomms communicators do not
    take. Anything else is refused, saying what to pass instead."""
    if pg_options is None:
        return {}
    if isinstance(pg_options, dict):
        bad = [k for k, v in pg_options.items() if not isinstance(k, str) or not isinstance(v, str)]
        if bad:
            raise CommTypeError(
                f"pg_options for torchcomms backend {backend!r}: a dict of hints must map "
                f"str to str, got {pg_options!r}; write numbers as strings, e.g. "
                "{'arena_bytes': '1048576'}"
            )
        return dict(pg_options)
    gloo = getattr(_c10d, "ProcessGroupGloo", None)
    gloo_options = getattr(gloo, "_Options", None) if gloo is not None else None
    if gloo_options is not None and isinstance(pg_options, gloo_options):
        devices = list(getattr(pg_options, "_devices", []) or [])
        if devices:
            raise CommInputError(
                f"pg_options for torchcomms backend {backend!r}: gloo options that choose "
                f"gloo devices ({len(devices)} given) do not apply to torchcomms "
                "communicators; choose the interface with GLOO_SOCKET_IFNAME (the hier "
                "backend's hosts with TORCHCOMM_HOST_ID), or pass a dict of hints"
            )
        return {}
    raise CommTypeError(
        f"pg_options of type {type(pg_options).__name__} do not apply to torchcomms backend "
        f"{backend!r}; pass None or a dict of the backend's hints (each plugin's README "
        "lists its hints; `torchcomms backends --json` lists every backend's), and the "
        "timeout as timeout="
    )
