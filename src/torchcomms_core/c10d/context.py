"""Completing ``torch.distributed``'s view of torchcomms when we were imported first.

``torch.distributed`` looks torchcomms up while it is imported (under
``TORCH_DISTRIBUTED_USE_TORCHCOMMS``); see :func:`complete_torch_registration`. What c10d
passes when it creates a group on us is read by ``torchcomms_core.creation.group_record``.

A light entry point for the faces (``torchcomms``, ``torchcomms_core``): it loads the
bridge (``backend_wrapper``, which does the work) only when torch needs the names; the
bridge never imports it.
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
    package is complete, this sets what torch's own lookup would have set (see
    ``backend_wrapper.complete_registration``).
    """
    c10d: Any = sys.modules.get("torch.distributed.distributed_c10d")
    # Not imported yet, or still importing: nothing to complete, and the bridge stays
    # unloaded.
    if c10d is None or getattr(c10d, "_TORCHCOMM_AVAILABLE", True):
        return
    from torchcomms_core.c10d.backend_wrapper import complete_registration

    complete_registration()
