"""torchcomms-core: communicators over pluggable backends for PyTorch.

The public face is the ``torchcomms`` package, which re-exports these names.
Importing this package touches no ``torch.distributed`` attribute and loads no plugin.
"""

from __future__ import annotations

from torchcomms_core.c10d.context import register_c10d_backends
from torchcomms_core.comm.batch import BatchSendRecv, P2POp, P2POpType
from torchcomms_core.comm.create import new_comm
from torchcomms_core.comm.handles import RemovableHandle
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.comm.transport import (
    RdmaMemory,
    RdmaMemoryMutableView,
    RdmaMemoryView,
    RdmaRemoteBuffer,
    RdmaTransport,
    TransportNotFoundError,
    available_transports,
    register_transport,
    unregister_transport,
)
from torchcomms_core.comm.window import TorchCommWinAccessType, TorchCommWindow, TorchCommWindowAttr
from torchcomms_core.engines import C10dBackend
from torchcomms_core.foundation.errors import (
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
from torchcomms_core.foundation.version import __version__
from torchcomms_core.foundation.work import TorchWork, WorkStatus
from torchcomms_core.operations.args import (
    POST_HOOK_CLASSES,
    PRE_HOOK_CLASSES,
    BatchOpIssuePostHookArgs,
    CollectivePostHookArgs,
    FinalizePostHookArgs,
    NewWindowPostHookArgs,
    OpArgs,
    OpName,
    SplitPostHookArgs,
)
from torchcomms_core.operations.options import (
    AllGatherOptions,
    AllGatherPExecOptions,
    AllGatherPInitOptions,
    AllGatherSingleOptions,
    AllReduceOptions,
    AllToAllOptions,
    AllToAllSingleOptions,
    AllToAllvSingleOptions,
    BarrierOptions,
    BatchP2POptions,
    BroadcastOptions,
    CommOptions,
    GatherOptions,
    InitHandle,
    ReconfigureOptions,
    RecvOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ReduceScatterSingleOptions,
    ScatterOptions,
    SendOptions,
    Timeout,
)
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.plugin_host.backends import (
    available_backends,
    built_backends,
    get_backend_class,
    get_mem_allocator,
    is_backend_built,
    register_backend,
    unregister_backend,
)
from torchcomms_core.plugin_host.backends import (
    is_backend_registered as _is_backend_registered,  # the reference's private names
)
from torchcomms_core.plugin_host.backends import load_backend as _load_backend
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.hookspecs import hookimpl
from torchcomms_core.plugin_host.manager import (
    PluginError,
    get_plugin_manager,
    list_collectives,
    load_plugins,
    register_plugin,
    unregister_plugin,
)
from torchcomms_core.spec import SPEC_VERSION, TorchCommBackend, method_support


def __getattr__(name: str) -> object:
    # The bridge's work class loads torch.distributed, so it is only imported when asked for.
    if name == "WorkWrapper":
        from torchcomms_core.c10d.work import CommWork

        return CommWork
    raise AttributeError(f"module 'torchcomms' has no attribute {name!r}")


# The pre-hook argument classes by their reference names (SendPreHookArgs, ...).
globals().update(PRE_HOOK_CLASSES)

__all__ = [
    "POST_HOOK_CLASSES",
    "PRE_HOOK_CLASSES",
    "SPEC_VERSION",
    "AllGatherOptions",
    "AllGatherPExecOptions",
    "AllGatherPInitOptions",
    "AllGatherSingleOptions",
    "AllReduceOptions",
    "AllToAllOptions",
    "AllToAllSingleOptions",
    "AllToAllvSingleOptions",
    "BarrierOptions",
    "BatchOpIssuePostHookArgs",
    "BatchP2POptions",
    "BroadcastOptions",
    "CollectivePostHookArgs",
    "FinalizePostHookArgs",
    "GatherOptions",
    "InitHandle",
    "NewWindowPostHookArgs",
    "P2POpType",
    "ReconfigureOptions",
    "RecvOptions",
    "ReduceOptions",
    "ReduceScatterOptions",
    "ReduceScatterSingleOptions",
    "ScatterOptions",
    "SendOptions",
    "SplitPostHookArgs",
    "Timeout",
    "_is_backend_registered",
    "_load_backend",
    "built_backends",
    "get_mem_allocator",
    "is_backend_built",
    *sorted(PRE_HOOK_CLASSES),
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
    "RdmaMemory",
    "RdmaMemoryMutableView",
    "RdmaMemoryView",
    "RdmaRemoteBuffer",
    "RdmaTransport",
    "ReduceOp",
    "RemovableHandle",
    "TorchComm",
    "TorchCommBackend",
    "TorchCommError",
    "TorchCommWinAccessType",
    "TorchCommWindow",
    "TorchCommWindowAttr",
    "TorchWork",
    "TransportNotFoundError",
    "WorkStatus",
    "__version__",
    "available_backends",
    "available_transports",
    "get_backend_class",
    "get_plugin_manager",
    "hookimpl",
    "list_collectives",
    "load_plugins",
    "method_support",
    "new_comm",
    "register_backend",
    "register_c10d_backends",
    "register_plugin",
    "register_transport",
    "unregister_backend",
    "unregister_plugin",
    "unregister_transport",
]


def _complete_torch_registration() -> None:
    # torch.distributed looks torchcomms up while it is imported; when the core imported
    # torch (the core first, torch second) it found us half-initialised and turned the
    # switch off. Give it the names back, loading the bridges only when the switch is on:
    # the face (``import torchcomms``) completes it in every case.
    import sys

    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or getattr(c10d, "_TORCHCOMM_AVAILABLE", True):
        return
    if not getattr(getattr(c10d, "dist_config", None), "use_torchcomms", False):
        return
    from torchcomms_core.c10d.context import complete_torch_registration

    complete_torch_registration()


_complete_torch_registration()
