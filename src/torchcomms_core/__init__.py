"""torchcomms-core: communicators over pluggable backends for PyTorch.

The public face is the ``torchcomms`` package, which re-exports these names.
Importing this package touches no ``torch.distributed`` attribute and loads no plugin.
"""

from __future__ import annotations

from .c10d_adapter import C10dBackend
from .collectives import Collective
from .comm import BatchSendRecv, P2POp, RemovableHandle, TorchComm, new_comm
from .errors import (
    BackendLoadError,
    BackendNotFoundError,
    BootstrapError,
    CommInputError,
    CommOperationError,
    CommStateError,
    CommTimeoutError,
    CommTypeError,
    TorchCommError,
)
from .functional import is_torch_compile_supported, is_torch_compile_supported_and_enabled
from .hookspecs import hookimpl
from .op_args import OpArgs, OpName
from .options import CommOptions
from .plugins import (
    PluginError,
    get_plugin_manager,
    list_collectives,
    load_plugins,
    register_plugin,
    unregister_plugin,
)
from .reduce_op import RedOpType, ReduceOp
from .registry import available_backends, get_backend_class, register_backend, unregister_backend
from .spec import SPEC_VERSION, TorchCommBackend, method_support
from .window import TorchCommWinAccessType, TorchCommWindow, TorchCommWindowAttr
from .work import TorchWork, WorkStatus

__version__ = "0.1.0"

__all__ = [
    "SPEC_VERSION",
    "BackendLoadError",
    "BackendNotFoundError",
    "BatchSendRecv",
    "BootstrapError",
    "C10dBackend",
    "Collective",
    "CommInputError",
    "CommOperationError",
    "CommOptions",
    "CommStateError",
    "CommTimeoutError",
    "CommTypeError",
    "OpArgs",
    "OpName",
    "P2POp",
    "PluginError",
    "RedOpType",
    "ReduceOp",
    "RemovableHandle",
    "TorchComm",
    "TorchCommBackend",
    "TorchCommError",
    "TorchCommWinAccessType",
    "TorchCommWindow",
    "TorchCommWindowAttr",
    "TorchWork",
    "WorkStatus",
    "__version__",
    "available_backends",
    "get_backend_class",
    "get_plugin_manager",
    "hookimpl",
    "is_torch_compile_supported",
    "is_torch_compile_supported_and_enabled",
    "list_collectives",
    "load_plugins",
    "method_support",
    "new_comm",
    "register_backend",
    "register_plugin",
    "unregister_backend",
    "unregister_plugin",
]

if is_torch_compile_supported_and_enabled():
    # TORCHCOMMS_PATCH_FOR_COMPILE=1: register the torchcomms custom ops and route
    # TorchComm collectives through them while tracing (docs/torch-compile.md).
    from .functional import collectives as _compile_collectives  # noqa: F401

# Imported before torch, we were half-initialised when torch.distributed looked for us.
from .pytorch.c10d_context import complete_torch_registration as _complete_registration

_complete_registration()
