"""The communicator: ``TorchComm`` and what it returns, in one package.

``base`` alone holds a communicator's mutable state (identity, lifecycle state, hooks,
the lean lane, the fault-tolerance membership) and offers the rest of the package a small
internal interface (``CommBase.INTERFACE``): start an operation (``_guard``), issue it
(``_issue``), run the hooks of an operation without a work (``_hooks_before``,
``_hooks_after``), leave and rejoin a group (``_unbind``, ``_rebind``), the
fault-tolerance membership (``_membership``). ``call`` holds one operation being
prepared (staging, completion steps, hook arguments) and ``lifetime`` what outlives
calls (the live communicators released at exit, the release of a dropped one,
``Membership``); both sit below ``base``. ``operations`` holds the public operations
(``TorchComm``); ``reconfigure``, ``window``, ``batch``, ``anysource`` and ``handles``
sit beside it and use only that interface. No module outside this package reads a ``_``
member of a communicator (``scripts/private_reaches.py`` and
``tests/plugins/test_import_contract.py`` check it): what others need is public, as
``on_work_failure`` (an engine failure ended one of its works, which call it, as the
``Communicator`` protocol declares) and ``lean_lane()`` (where the c10d bridge hands
plain calls).
"""

from __future__ import annotations

from torchcomms_core.comm.batch import BatchSendRecv, P2POp, P2POpType
from torchcomms_core.comm.handles import PersistentAllGather, RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.comm.window import TorchCommWindow, TorchCommWindowAttr

__all__ = [
    "BatchSendRecv",
    "P2POp",
    "P2POpType",
    "PersistentAllGather",
    "RemovableHandle",
    "TorchComm",
    "TorchCommWindow",
    "TorchCommWindowAttr",
]
