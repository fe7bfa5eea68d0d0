"""Which network interface the Gloo engine binds to: ``TORCHCOMM_GLOO_INTERFACE``.

Multi-host runs (and the network-namespace bench harness) name the interface explicitly.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from torchcomms_core import CommInputError, _env


def engine_options(timeout: timedelta) -> Any:
    """What to build ``ProcessGroupGloo`` with: just ``timeout`` (torch's defaults, which honour
    ``GLOO_SOCKET_IFNAME``), or options bound to ``TORCHCOMM_GLOO_INTERFACE`` when it is set."""
    from torch.distributed import ProcessGroupGloo

    interface = _env.gloo_interface()
    if interface is None:
        return timeout
    try:
        device = ProcessGroupGloo.create_device(interface=interface)
    except RuntimeError as exc:
        raise CommInputError(
            f"{_env.GLOO_INTERFACE}={interface!r}: gloo cannot use this interface ({exc}); "
            f"set it to an interface with an IPv4 address (`ip -brief address` lists them) "
            f"or unset it"
        ) from None
    opts = ProcessGroupGloo._Options()
    opts._devices = [device]
    opts._timeout = timeout
    return opts
