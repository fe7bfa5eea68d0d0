"""``torch.distributed`` look-alike over torchcomms (``import torchcomms.distwrap as dist``).

Re-exports only; the code lives in ``torchcomms_core.pytorch.distwrap``.
"""

from torchcomms_core.pytorch.distwrap import *  # noqa: F403
from torchcomms_core.pytorch.distwrap import (  # noqa: F401
    __all__,
    __getattr__,
)
