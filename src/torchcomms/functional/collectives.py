"""torchcomms.functional.collectives: the custom ops and the TorchComm routing (re-exports)."""

from torchcomms_core.functional.collectives import *  # noqa: F403
from torchcomms_core.functional.collectives import __all__  # noqa: F401
