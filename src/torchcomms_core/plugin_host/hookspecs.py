"""Every hook a torchcomms plugin can implement (pluggy project name ``torchcomms``).

Plugins are found through the ``torchcomms.plugins`` entry-point group. Hooks run at
load time and on communicator lifecycle events, never on each operation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from torchcomms_core.foundation.protocols import Communicator as TorchComm
    from torchcomms_core.plugin_host.collective import Collective

#: Marks a function of this module as a torchcomms hook specification.
hookspec = pluggy.HookspecMarker("torchcomms")
#: Marks a plugin's function as its implementation of the torchcomms hook of the same name
#: (``@hookimpl def torchcomms_register_collectives(): ...``).
hookimpl = pluggy.HookimplMarker("torchcomms")


# -- collectives ---------------------------------------------------------------------------


@hookspec
def torchcomms_register_collectives() -> list[Collective]:
    """Return the collectives this plugin adds to every communicator.

    Called once, when plugins are loaded. Each result becomes a method of
    ``TorchComm`` named ``Collective.name``.
    """
    return []


# -- communicator lifecycle ----------------------------------------------------------------


@hookspec
def torchcomms_comm_created(comm: TorchComm, parent: TorchComm | None) -> None:
    """Observe a communicator right after ``new_comm`` or ``split`` created it.

    :param comm: the new communicator, ready for operations.
    :param parent: the communicator it was split from, or ``None`` (``new_comm``).
    """


@hookspec
def torchcomms_comm_finalized(comm: TorchComm) -> None:
    """Observe a communicator that was just finalized.

    :param comm: the communicator; it accepts no more operations.
    """


@hookspec
def torchcomms_comm_aborted(comm: TorchComm, reason: str) -> None:
    """Observe a communicator that was aborted or failed (timeout, dead peer).

    :param comm: the communicator.
    :param reason: ``"abort"`` for ``comm.abort()``, else the error's message.
    """
