"""Transport registry: which transport plugin (``torchcomms.transports``) serves the process.

The same :class:`~torchcomms_core.plugin_host.registry.EntryPointRegistry` as backends,
over the ``torchcomms.transports`` group; plus the choice of one transport
(``TORCHCOMM_TRANSPORT``, else the only one, else ``nixl``) and its one provider instance
per process. The user API over it (``RdmaTransport``, ``RdmaMemory``) is
:mod:`torchcomms_core.comm.transport`.
"""

from __future__ import annotations

import threading
from typing import Any

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import CommStateError, TransportNotFoundError
from torchcomms_core.plugin_host.registry import (
    ClassCheck,
    EntryPointRegistry,
    PluginEntry,
    runs_here,
)
from torchcomms_core.spec.transport import TRANSPORT_SPEC_VERSION, TransportProvider

__all__ = [
    "KNOWN_TRANSPORT_DISTRIBUTIONS",
    "PREFERRED_TRANSPORT",
    "TRANSPORTS",
    "TRANSPORTS_GROUP",
    "TransportEntry",
    "TransportNotFoundError",
    "available_transports",
    "describe_transports",
    "get_transport_class",
    "provider",
    "provider_class",
    "register_transport",
    "selected_transport",
    "transport_entry_points",
    "unregister_transport",
]

#: The entry-point group transport plugins register their provider class in.
TRANSPORTS_GROUP = "torchcomms.transports"
#: Distributions that provide the transports users ask for.
KNOWN_TRANSPORT_DISTRIBUTIONS: dict[str, str] = {"nixl": "torchcomms-nixl"}
#: Which transport is used when several are installed and ``TORCHCOMM_TRANSPORT`` is unset.
PREFERRED_TRANSPORT = "nixl"

INSTALL_HINT = (
    "install a transport plugin (`pip install torchcomms-nixl`: one-sided reads and writes "
    "over NIXL), or move data with a communicator's send/recv or a window's put()"
)

#: An installed transport: its entry point and the distribution that provides it.
TransportEntry = PluginEntry


#: The transports by name: in-process registrations, then the ``torchcomms.transports`` group.
TRANSPORTS: EntryPointRegistry[TransportProvider] = EntryPointRegistry(
    group=TRANSPORTS_GROUP,
    kind="transport",
    check=ClassCheck(TransportProvider, TRANSPORT_SPEC_VERSION),
    known_distributions=KNOWN_TRANSPORT_DISTRIBUTIONS,
    alternative=f", or pick another with {_env.TRANSPORT}",
    not_found=TransportNotFoundError,
    caller="RdmaTransport",
)

_lock = threading.Lock()
_instances: dict[type[TransportProvider], TransportProvider] = {}


def register_transport(name: str, provider_class: type[TransportProvider]) -> None:
    """Register ``provider_class`` as transport ``name`` for this process (tests, notebooks);
    it replaces an earlier registration of that name."""
    TRANSPORTS.register(name, provider_class, override=True)


def unregister_transport(name: str) -> None:
    """Remove an in-process registration (entry points are unaffected)."""
    cls = TRANSPORTS.unregister(name)
    if cls is not None:
        with _lock:
            _instances.pop(cls, None)


def transport_entry_points() -> dict[str, TransportEntry]:
    """Installed transports by name, read from distribution metadata (nothing is imported)."""
    return TRANSPORTS.entry_points()


#: Names of the transports registered in-process or installed as plugins.
available_transports = TRANSPORTS.names
#: The provider class of transport ``name``, importing only its plugin; raises
#: ``TransportNotFoundError`` where no transport has that name, ``BackendLoadError`` where
#: its plugin fails to import or is incompatible.
get_transport_class = TRANSPORTS.get


def selected_transport() -> str | None:
    """The transport in use: ``TORCHCOMM_TRANSPORT``, else the only one, else ``nixl``/the
    first of several; ``None`` when none is installed."""
    choice = _env.transport_choice()
    if choice is not None:
        return choice
    names = available_transports()
    if not names:
        return None
    return PREFERRED_TRANSPORT if PREFERRED_TRANSPORT in names else names[0]


def provider_class(where: str) -> type[TransportProvider]:
    """The selected transport's provider class, once it says it can run here.

    Raises:
        TransportNotFoundError: no transport is installed, or not the one selected.
        CommStateError: the transport cannot run on this machine.
    """
    name = selected_transport()
    if name is None:
        raise TransportNotFoundError(
            f"{where}: no torchcomms transport is installed; {INSTALL_HINT}"
        )
    cls = get_transport_class(name)
    ok, reason = runs_here(cls)
    if not ok:
        raise CommStateError(f"{where}: transport {name!r} cannot run here: {reason}")
    return cls


def provider(where: str) -> TransportProvider:
    """The process's provider instance (made on first use), or an error saying why not."""
    cls = provider_class(where)
    with _lock:
        instance = _instances.get(cls)
        if instance is None:
            instance = _instances[cls] = cls()
    return instance


def describe_transports() -> list[dict[str, Any]]:
    """One record per transport: distribution, version, devices, whether it runs here, and
    whether it is the one in use (``selected``)."""
    chosen = selected_transport()

    def loaded(cls: type[TransportProvider]) -> dict[str, Any]:
        runnable, reason = runs_here(cls)
        return {
            "spec_version": cls.spec_version,
            "devices": list(cls.devices),
            "runnable": runnable,
            "reason": "" if runnable else reason,
        }

    return TRANSPORTS.describe(
        loaded,
        lambda exc: {
            "spec_version": "?",
            "devices": [],
            "runnable": False,
            "reason": f"failed: {exc}",
        },
        about=lambda name, entry: {"selected": name == chosen},
    )
