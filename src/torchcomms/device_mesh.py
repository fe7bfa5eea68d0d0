"""``DeviceMesh`` and process groups over torchcomms communicators.

Re-exports only; the code lives in ``torchcomms_core.pytorch``.
"""

from torchcomms_core.pytorch.device_mesh import init_device_mesh
from torchcomms_core.pytorch.groups import as_process_group

__all__ = ["as_process_group", "init_device_mesh"]
