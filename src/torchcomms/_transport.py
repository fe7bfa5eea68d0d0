"""The reference's RDMA transport module (re-exports only; see torchcomms_core._transport)."""

from torchcomms_core._transport import *  # noqa: F403
from torchcomms_core._transport import __all__  # noqa: F401
