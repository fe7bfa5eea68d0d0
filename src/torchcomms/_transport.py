"""The reference's RDMA transport module (re-exports only; see torchcomms_core.comm.transport)."""

from torchcomms_core.comm.transport import *  # noqa: F403
from torchcomms_core.comm.transport import __all__  # noqa: F401
