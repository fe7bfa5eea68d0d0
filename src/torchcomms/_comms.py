"""The names the reference's compiled ``torchcomms._comms`` module exposes.

Re-exports only. PyTorch 2.13 looks for ``torchcomms._comms._BackendWrapper`` first, and
code written for the reference imports ``TorchCommBackend``, ``ReduceOp`` and friends from
here; everything comes from ``torchcomms_core``.
"""

# The wrapper's options are c10d's backend options (what ``_BackendWrapper.options`` holds).
from torch._C._distributed_c10d import Backend as _Backend

from torchcomms_core import *  # noqa: F403
from torchcomms_core import __all__ as _core_all
from torchcomms_core.c10d.backend_wrapper import BackendWrapper as _BackendWrapper  # noqa: F401
from torchcomms_core.plugin_host.backends import (  # noqa: F401
    is_backend_registered as _is_backend_registered,
)

_BackendWrapperOptions = _Backend.Options

__all__ = [name for name in _core_all if not name.startswith("_")]
