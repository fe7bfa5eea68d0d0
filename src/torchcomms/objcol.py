"""Object collectives over a ``TorchComm``, safe to deserialise by default.

Re-exports only; the code lives in ``torchcomms_core.pytorch.objcol``.
"""

from torchcomms_core.pytorch.objcol import *  # noqa: F403
from torchcomms_core.pytorch.objcol import __all__  # noqa: F401
