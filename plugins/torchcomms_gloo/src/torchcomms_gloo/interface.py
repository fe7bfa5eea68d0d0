"""Where the Gloo engine binds: ``TORCHCOMM_GLOO_INTERFACE`` or ``TORCHCOMM_GLOO_HOSTNAME``.

Multi-host runs (and the network-namespace bench harness) name the interface explicitly.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from torchcomms_core.plugin import CommInputError

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


#: torch's own variable naming the interfaces ProcessGroupGloo binds to by default.
GLOO_SOCKET_IFNAME = "GLOO_SOCKET_IFNAME"


def rendezvous_address(hints: dict[str, str] | None = None) -> str | None:
    """Where a self-hosted rendezvous listens: the address gloo binds to (same precedence as
    :func:`engine_options`, then ``GLOO_SOCKET_IFNAME``), or ``None`` for torch's default
    (every interface, advertised under this host's name)."""
    hints = hints or {}
    interface = hints.get("interface") or _variable(GLOO_INTERFACE)
    if interface is None and not hints.get("hostname") and not _variable(GLOO_HOSTNAME):
        named = _variable(GLOO_SOCKET_IFNAME)
        interface = named.split(",")[0].strip() if named else None
    if interface is not None:
        return interface_address(interface)
    return hints.get("hostname") or _variable(GLOO_HOSTNAME)


def interface_address(interface: str) -> str:
    """The IPv4 address of ``interface`` (Linux), or a clear error naming it."""
    import fcntl
    import socket
    import struct

    request = struct.pack("256s", interface.encode()[:15])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            # SIOCGIFADDR: the interface's IPv4 address (gloo binds interfaces by it too).
            reply = fcntl.ioctl(sock.fileno(), 0x8915, request)
        except OSError as exc:
            raise CommInputError(
                f"gloo: interface {interface!r} ({GLOO_INTERFACE}, hint 'interface' or "
                f"{GLOO_SOCKET_IFNAME}) has no IPv4 address here ({exc}); `ip -brief address` "
                f"lists the interfaces"
            ) from None
    return socket.inet_ntoa(reply[20:24])
