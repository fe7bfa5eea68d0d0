"""The reference's RDMA transport module (re-exports only; see torchcomms_core.transport)."""

from torchcomms_core.transport import *  # noqa: F403
from torchcomms_core.transport import __all__  # noqa: F401
