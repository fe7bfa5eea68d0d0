"""torchcomms.functional: torch.compile and autograd support (re-exports only)."""

from torchcomms_core.functional import *  # noqa: F403
from torchcomms_core.functional import (  # noqa: F401
    MIN_PYTORCH_VERSION_FOR_COMPILE,
    __all__,
    is_torch_compile_supported,
)
