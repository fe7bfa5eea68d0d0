"""torchcomms: the public face of torchcomms-core.

Re-exports the core, the torch.compile switch helpers and, bound at import as the
reference does, ``torchcomms.hooks`` and ``torchcomms.objcol``. Importing the face (not
``torchcomms_core`` or ``torchcomms_core.plugin``, which plugin authors use) is what
loads the PyTorch bridges: under ``TORCHCOMMS_PATCH_FOR_COMPILE=1`` the torchcomms custom
ops are registered, and ``torch.distributed`` is given our names when torch was imported
from inside ours.
"""

from torchcomms_core import *  # noqa: F403
from torchcomms_core import __all__ as _core_all
from torchcomms_core import (  # noqa: F401
    __getattr__,  # noqa: F401  (WorkWrapper, loaded on first use)
    __version__,
)
from torchcomms_core.c10d.context import complete_torch_registration as _complete
from torchcomms_core.functional import (
    is_torch_compile_supported as is_torch_compile_supported,
)
from torchcomms_core.functional import (
    is_torch_compile_supported_and_enabled as is_torch_compile_supported_and_enabled,
)

from . import hooks, objcol  # noqa: E402,F401

__all__ = sorted(
    [*_core_all, "is_torch_compile_supported", "is_torch_compile_supported_and_enabled"]
)

if is_torch_compile_supported_and_enabled():
    # TORCHCOMMS_PATCH_FOR_COMPILE=1: register the torchcomms custom ops and route
    # TorchComm collectives through them while tracing (docs/torch-compile.md).
    from torchcomms_core.functional import collectives as _compile_collectives  # noqa: F401

_complete()
