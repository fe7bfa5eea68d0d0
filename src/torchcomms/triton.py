"""Device functions for Triton kernels on a window's device handle (the reference's
``torchcomms.triton``): re-exports of ``torchcomms_core.device.functions``.

Needs triton (``pip install 'torchcomms-core[triton]'``); see docs/device.md.
"""

from torchcomms_core.device.functions import *  # noqa: F403
from torchcomms_core.device.functions import __all__  # noqa: F401
