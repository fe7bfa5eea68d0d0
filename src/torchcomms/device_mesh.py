"""``DeviceMesh`` and process groups over torchcomms communicators.

Re-exports only; the code lives in ``torchcomms_core.pytorch``.
"""

from torchcomms_core.c10d.backend_wrapper import BackendWrapper as _BackendWrapper
from torchcomms_core.c10d.groups import as_process_group
from torchcomms_core.pytorch.device_mesh import (
    create_torchcomm_process_group as _create_torchcomm_process_group,
)
from torchcomms_core.pytorch.device_mesh import flatten_with_comm as _flatten_with_comm
from torchcomms_core.pytorch.device_mesh import init_device_mesh

__all__ = [
    "_BackendWrapper",
    "_create_torchcomm_process_group",
    "_flatten_with_comm",
    "as_process_group",
    "init_device_mesh",
]
