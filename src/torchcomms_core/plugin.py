"""Everything a plugin author needs, in one namespace: ``from torchcomms_core.plugin import ...``.

A backend plugin subclasses :class:`TorchCommBackend` (or :class:`C10dBackend` to wrap a
``torch.distributed`` engine, :class:`NcclEngineBackend` for the NCCL family), returns
works the core can wait on (its engine's own, :class:`C10dWork`, :class:`MultiWork`,
:class:`ThenWork`), and may return a :class:`WindowEngine` from ``new_window()``. A
collective plugin implements the hooks of :mod:`torchcomms_core.plugin_host.hookspecs` with
:data:`hookimpl` and describes its operation with :class:`Collective`. A transport plugin
implements :class:`TransportProvider`. A tuner plugin (``torchcomms.tuners``) subclasses
:class:`Tuner` and answers a :class:`Query` with a :class:`Choice`; a backend declares its
:class:`Algorithm` s per operation in ``algorithms`` (:class:`OpAlgorithms`) and asks
``self.tuning.choose(op, nbytes, dtype)``. A backend built of other backends' communicators
(``torchcomms-hier``) creates them with :func:`new_member_comm` and looks backends up with
:func:`get_backend_class`. A collective declares its benchmark with the
toolkit ``bench`` (``torchcomms_core.bench.kit``, imported on first use). The
conformance suite and the rank helpers of :mod:`torchcomms_core.testing` check a plugin
against the spec.

The plugins in ``plugins/`` import from this module only (an import contract checks it).
Importing it loads the core's communicator and the spec, never the PyTorch bridges
(``torchcomms_core.pytorch``) or the torch.compile ops (``torchcomms_core.functional``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torchcomms_core.comm.create import new_comm, new_member_comm
from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.comm.transport import (
    RdmaMemory,
    RdmaRemoteBuffer,
    RdmaTransport,
    TransportNotFoundError,
)
from torchcomms_core.engines.c10d_engine import C10dBackend, C10dWork
from torchcomms_core.engines.nccl_engine import (
    NcclEngineBackend,
    cuda_unavailable_reason,
    nccl_available,
    rocm_version,
)
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
from torchcomms_core.foundation.records import read_record
from torchcomms_core.foundation.work import TorchWork, WorkStatus
from torchcomms_core.operations.hints import UnknownHintWarning, bool_hint, int_hint
from torchcomms_core.operations.options import CommOptions
from torchcomms_core.operations.reduce_op import RedOpType, ReduceOp
from torchcomms_core.plugin_host.backends import available_backends, get_backend_class
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.hookspecs import hookimpl, hookspec
from torchcomms_core.plugin_host.tuners import register_tuner, unregister_tuner
from torchcomms_core.spec import (
    BASIC_REDUCE_OPS,
    DEFAULT_DTYPES,
    DERIVABLE_METHODS,
    OPTIONAL_METHODS,
    REQUIRED_METHODS,
    SPEC_VERSION,
    TUNER_SPEC_VERSION,
    Algorithm,
    BatchOp,
    Choice,
    MultiWork,
    OpAlgorithms,
    PortableDefaults,
    Query,
    ThenWork,
    TorchCommBackend,
    TorchCommWinAccessType,
    Tuner,
    TunerContext,
    Tuning,
    TuningWarning,
    WindowEngine,
    check_spec_version,
    flat_chunks,
    method_support,
    overlaps,
    reduce_rows,
    settle,
    size_bucket,
    split_dim0,
    then,
    unflatten_into,
)
from torchcomms_core.spec.kit import (
    ELEMENTWISE_REDUCE,
    LOCAL_SIZE_VARIABLES,
    SignalFile,
    StoredRankAndSize,
    WindowPeers,
    displacements,
    env_count,
    launcher_local_ranks,
    usable_cores,
)
from torchcomms_core.spec.native_build import NativeBuild
from torchcomms_core.spec.transport import (
    RESULT_SUCCESS,
    TRANSPORT_SPEC_VERSION,
    MemoryRegistration,
    TransportEndpoint,
    TransportProvider,
)
from torchcomms_core.testing import (
    CountingStore,
    RankPool,
    StoreCounts,
    current_rank,
    simulated_rank,
)

if TYPE_CHECKING:
    from torchcomms_core.bench import kit as bench


def __getattr__(name: str) -> Any:
    # ``bench`` (the toolkit of ``Collective(bench=...)``) is imported on first use only:
    # loading a plugin must not load the benchmark code.
    if name == "bench":
        from torchcomms_core.bench import kit

        return kit
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # backend authors' kit (torchcomms_core.spec.kit)
    "ELEMENTWISE_REDUCE",
    "LOCAL_SIZE_VARIABLES",
    "NativeBuild",
    "SignalFile",
    "StoredRankAndSize",
    "WindowPeers",
    "displacements",
    "env_count",
    "launcher_local_ranks",
    "usable_cores",
    "PortableDefaults",
    "overlaps",
    "settle",
    # algorithms and tuners (torchcomms_core.spec.tuning)
    "TUNER_SPEC_VERSION",
    "Algorithm",
    "Choice",
    "OpAlgorithms",
    "Query",
    "Tuner",
    "TunerContext",
    "Tuning",
    "TuningWarning",
    "register_tuner",
    "size_bucket",
    "unregister_tuner",
    # the rest
    "BASIC_REDUCE_OPS",
    "DEFAULT_DTYPES",
    "DERIVABLE_METHODS",
    "OPTIONAL_METHODS",
    "REQUIRED_METHODS",
    "RESULT_SUCCESS",
    "SPEC_VERSION",
    "TRANSPORT_SPEC_VERSION",
    "BackendLoadError",
    "BackendNotFoundError",
    "BatchOp",
    "BootstrapError",
    "C10dBackend",
    "C10dWork",
    "Collective",
    "CommInputError",
    "CommOperationError",
    "CommOptions",
    "CommStateError",
    "CommTimeoutError",
    "CommTypeError",
    "CountingStore",
    "MemoryRegistration",
    "MultiWork",
    "NcclEngineBackend",
    "RankPool",
    "RdmaMemory",
    "RdmaRemoteBuffer",
    "RdmaTransport",
    "RedOpType",
    "ReduceOp",
    "StoreCounts",
    "ThenWork",
    "TorchComm",
    "TorchCommBackend",
    "TorchCommError",
    "TorchCommWinAccessType",
    "TorchWork",
    "TransportEndpoint",
    "TransportNotFoundError",
    "TransportProvider",
    "UnknownHintWarning",
    "WindowEngine",
    "WorkStatus",
    "available_backends",
    "bench",
    "bool_hint",
    "check_spec_version",
    "cuda_unavailable_reason",
    "current_rank",
    "flat_chunks",
    "get_backend_class",
    "hookimpl",
    "hookspec",
    "int_hint",
    "method_support",
    "nccl_available",
    "new_comm",
    "new_member_comm",
    "read_record",
    "reduce_rows",
    "rocm_version",
    "simulated_rank",
    "split_dim0",
    "then",
    "unflatten_into",
]
