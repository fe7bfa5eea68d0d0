"""Where the Gloo engine binds: ``TORCHCOMM_GLOO_INTERFACE`` or ``TORCHCOMM_GLOO_HOSTNAME``.

Multi-host runs (and the network-namespace bench harness) name the interface explicitly.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from torchcomms_core import CommInputError

#: The interface (``eth0``) the engine binds to; wins over the hostname.
GLOO_INTERFACE = "TORCHCOMM_GLOO_INTERFACE"
#: An address or hostname of this host the engine binds to.
GLOO_HOSTNAME = "TORCHCOMM_GLOO_HOSTNAME"


def _variable(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def engine_options(timeout: timedelta, hints: dict[str, str] | None = None) -> Any:
    """What to build ``ProcessGroupGloo`` with: just ``timeout`` (torch's defaults, which honour
    ``GLOO_SOCKET_IFNAME``), or options bound to an interface or a hostname.

    As in the reference, the hints ``interface``/``hostname`` win over
    ``TORCHCOMM_GLOO_INTERFACE``/``TORCHCOMM_GLOO_HOSTNAME``; an interface wins over a hostname.
    """
    from torch.distributed import ProcessGroupGloo

    hints = hints or {}
    interface = hints.get("interface") or _variable(GLOO_INTERFACE)
    hostname = hints.get("hostname") or _variable(GLOO_HOSTNAME)
    if interface is None and hostname is None:
        return timeout
    try:
        if interface is not None:
            device = ProcessGroupGloo.create_device(interface=interface)
        else:
            device = ProcessGroupGloo.create_device(hostname=hostname)
    except RuntimeError as exc:
        what = (
            f"interface {interface!r} ({GLOO_INTERFACE} or hint 'interface')"
            if interface is not None
            else f"hostname {hostname!r} ({GLOO_HOSTNAME} or hint 'hostname')"
        )
        raise CommInputError(
            f"gloo cannot bind to {what}: {exc}; name an interface with an IPv4 address "
            f"(`ip -brief address` lists them) or a hostname that resolves to this host, or "
            f"unset it"
        ) from None
    # torch's stub lists only ProcessGroupGloo.Options; the extension also defines
    # _Options, the class whose _devices and _timeout ProcessGroupGloo reads.
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]
    opts._devices = [device]
    opts._timeout = timeout
    return opts
