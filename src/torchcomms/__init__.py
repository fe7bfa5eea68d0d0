"""torchcomms: the public face of torchcomms-core (re-exports only)."""

from torchcomms_core import *  # noqa: F403
from torchcomms_core import (  # noqa: F401
    __all__,
    __getattr__,  # noqa: F401  (WorkWrapper, loaded on first use)
    __version__,
)

# Bound at import, as the reference does: ``torchcomms.hooks`` and ``torchcomms.objcol``.
from . import hooks, objcol  # noqa: E402,F401
