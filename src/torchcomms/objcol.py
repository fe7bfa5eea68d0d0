"""Object collectives over a ``TorchComm``, safe to deserialise by default.

Re-exports only; the code lives in ``torchcomms_core.comm.objcol``.
"""

from torchcomms_core.comm.objcol import *  # noqa: F403
from torchcomms_core.comm.objcol import __all__  # noqa: F401
