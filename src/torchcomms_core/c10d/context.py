"""Completing ``torch.distributed``'s view of torchcomms when we were imported first.

``torch.distributed`` looks torchcomms up while it is imported (under
``TORCH_DISTRIBUTED_USE_TORCHCOMMS``); see :func:`complete_torch_registration`. What c10d
passes when it creates a group on us is read by ``torchcomms_core.creation.group_record``.
"""

from __future__ import annotations

import sys
from typing import Any


def complete_torch_registration() -> None:
    """Give ``torch.distributed`` the torchcomms names its import could not find.

    ``torch.distributed`` looks torchcomms up while it is imported. When our package is
    imported first (``import torchcomms`` before ``import torch``), torch is imported
    from inside ours, finds it half-initialised, and turns
    ``TORCH_DISTRIBUTED_USE_TORCHCOMMS`` off for the whole process. Called once our
    package is complete, this sets what torch's own lookup would have set.
    """
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    # Not imported yet, or still importing (the flag is set at the end of its lookup):
    # torch's own lookup will run, or is running, against a complete package.
    if c10d is None or getattr(c10d, "_TORCHCOMM_AVAILABLE", True):
        return
    from torchcomms_core.c10d.backend_wrapper import _BackendWrapper
    from torchcomms_core.comm.create import new_comm
    from torchcomms_core.hooks.flight_recorder import FlightRecorderHook

    c10d._BackendWrapper = _BackendWrapper
    c10d.new_comm = new_comm
    c10d.FlightRecorderHook = FlightRecorderHook
    c10d._TORCHCOMM_AVAILABLE = True
