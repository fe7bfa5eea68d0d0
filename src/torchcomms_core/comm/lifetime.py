"""A communicator's life beyond its calls: from interpreter exit, the garbage collector and
``reconfigure``.

The live communicators, released in order at interpreter exit; the release of one
dropped without ``finalize()``; and the :class:`Membership` a communicator keeps between
reconfigures. ``comm.base`` uses it through ``CommBase``'s interface; it imports only the
spec's types, never the communicator.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torchcomms_core.spec import TorchCommBackend

# Live communicators, released in order at interpreter exit: engines torn down during
# module teardown can abort the process (joinable C++ threads), so they go first.
#: ``CommBase`` adds each communicator it builds; ``comm.base.live_communicators`` reads it.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def release_live_at_exit() -> None:
    """Release every live communicator (``comm.base`` registers it with ``atexit``).

    Registered once the modules the communicator needs are imported, so it runs before
    their own exit handlers tear the engines down.
    """
    for comm in list(LIVE):
        try:
            comm._release_quietly()
        except Exception:  # exiting anyway; never turn a clean exit into a failure
            pass


def release_dropped(backend: TorchCommBackend, name: str) -> None:
    """Release ``backend`` of the communicator ``name`` the garbage collector dropped."""
    warnings.warn(
        f"torchcomms communicator {name!r} was garbage-collected without finalize(); its "
        f"resources were released. Call comm.finalize() when you are done with it",
        ResourceWarning,
        stacklevel=2,
    )
    try:
        backend.finalize()
    except Exception:  # the engine may already be broken; never fail in a finalizer
        pass


class Membership:
    """Fault tolerance (``enable_reconfigure``): what ``reconfigure`` keeps between calls.

    ``handle``: this endpoint's init handle; ``uuids``: the uuids used; ``root_store``: the
    store members meet in when this rank's handle comes first (the one given at creation,
    or the one it hosts, ``rendezvous``); ``clients``: its connection to the store of the
    member whose handle came first last time. Owned by ``comm.reconfigure``; the
    communicator only drops ``clients`` when it ends.
    """

    __slots__ = ("handle", "uuids", "root_store", "rendezvous", "clients")

    def __init__(
        self, handle: str | None = None, root_store: Any = None, rendezvous: Any = None
    ) -> None:
        self.handle = handle
        self.uuids: set[str] = set()
        self.root_store = root_store
        self.rendezvous = rendezvous
        self.clients: dict[str, Any] = {}
