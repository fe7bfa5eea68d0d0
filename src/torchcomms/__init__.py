"""torchcomms: the public face of torchcomms-core (re-exports only)."""

from torchcomms_core import *  # noqa: F403
from torchcomms_core import __all__, __version__  # noqa: F401
