"""torch.compile and autograd for torchcomms: collectives as ``torch.library`` custom ops.

Importing this package only defines the switch helpers; the ops are registered and the
``TorchComm`` methods routed through them by importing :mod:`.collectives`, which
``import torchcomms`` does when :func:`is_torch_compile_supported_and_enabled` is true.
"""

from __future__ import annotations

# The version constant and is_torch_compile_supported are importable by name, as in Meta's
# torchcomms, but only the combined check is star-exported.
from torchcomms_core.functional.support import (
    MIN_PYTORCH_VERSION_FOR_COMPILE as MIN_PYTORCH_VERSION_FOR_COMPILE,
)
from torchcomms_core.functional.support import (
    is_torch_compile_supported as is_torch_compile_supported,
)
from torchcomms_core.functional.support import is_torch_compile_supported_and_enabled

__all__ = ["is_torch_compile_supported_and_enabled"]
