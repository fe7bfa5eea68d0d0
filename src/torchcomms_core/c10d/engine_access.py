"""What the c10d bridge knows of the engine behind a communicator, and of c10d's backends.

The c10d ``Backend`` or ``ProcessGroup`` a communicator runs on, whether it records into
c10d's own flight recorder, c10d's backend type for a name, c10d's table of group names
for an engine that is a whole group, and the guard on ``ProcessGroup._register_backend``.
``_BackendWrapper`` reads its engine through these; they hold no state of their own.

May import torch and the layers below the bridge (``comm``, ``engines``); nothing else of
the bridge.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch._C._distributed_c10d import ProcessGroup

from torchcomms_core.comm.operations import TorchComm
from torchcomms_core.foundation import torch_compat
from torchcomms_core.foundation.errors import CommTypeError


def _records_into_c10d(engine: Any) -> bool:
    """Whether ``engine`` records each operation, with the caller's stack, into c10d's
    flight recorder (``ProcessGroupGloo`` does)."""
    gloo = getattr(torch._C._distributed_c10d, "ProcessGroupGloo", None)
    return gloo is not None and isinstance(engine, gloo)


def _c10d_engine(comm: TorchComm) -> Any:
    """The c10d ``Backend`` a communicator runs on (``ProcessGroupGloo``), if any."""
    from torch._C._distributed_c10d import Backend

    engine = getattr(comm.get_backend_impl(), "engine", None)
    return engine if isinstance(engine, Backend) else None


def _c10d_registered(comm: TorchComm) -> bool:
    """Whether the communicator serves a backend c10d has registered (see
    ``engines.c10d_registered``)."""
    from torchcomms_core.engines.c10d_registered import C10dRegisteredBackend

    return isinstance(comm.get_backend_impl(), C10dRegisteredBackend)


def _c10d_group_engine(comm: TorchComm) -> Any:
    """The c10d ``ProcessGroup`` a communicator runs on, if its engine is one."""
    engine = getattr(comm.get_backend_impl(), "engine", None)
    return engine if isinstance(engine, ProcessGroup) else None


def _name_group_engine(engine: Any, name: str | None) -> None:
    """Enter (or, with ``None``, remove) a ProcessGroup engine in c10d's table of group
    names under its group's name. Without the switch the engine is the group, and a
    Python backend may look its own name up there (PyTorch's ``threaded`` backend keys
    its collectives by it)."""
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    names = getattr(getattr(c10d, "_world", None), "pg_names", None)
    if not isinstance(names, dict):
        return
    if name is None:
        names.pop(engine, None)
    elif engine not in names:
        names[engine] = name


# Engine methods the wrapper does not hand out (see _BackendWrapper.__getattr__).
_NOT_DELEGATED = frozenset(
    {
        "shrink",
        "suspend",
        "resume",
        "allocate_tensor",
        "mem_allocator",
        "setUsePgForSymmMemRendezvous",
    }
)


def _backend_type(name: str) -> Any:
    kinds = ProcessGroup.BackendType
    return {
        "gloo": kinds.GLOO,
        "nccl": kinds.NCCL,
        "ucc": kinds.UCC,
        "mpi": kinds.MPI,
        "xccl": kinds.XCCL,
    }.get(name, kinds.CUSTOM)


#: The backends c10d builds in: a group of one reports its name. c10d reports any other,
#: registered with ``Backend.register_backend``, as ``"custom"`` (its ``BackendType``).
C10D_BUILTIN_NAMES = frozenset({"gloo", "nccl", "ucc", "mpi", "xccl", "fake"})


def c10d_identity(backend: str) -> str:
    """The name c10d gives a group of ``backend`` (``pg.name()``): the backend's own name
    for one c10d builds in, ``"custom"`` for one it has registered. A Python group (such as
    PyTorch's ``threaded``) names itself; its name is passed through here unchanged when it
    is not a torchcomms backend."""
    if backend in C10D_BUILTIN_NAMES or backend == "custom":
        return backend
    from torchcomms_core.plugin_host.backends import is_backend_built

    return "custom" if is_backend_built(backend) else backend


def _guard_register_backend(wrapper: type, adapter: Callable[[Any], Any] | None = None) -> None:
    """Make ``pg._register_backend(device, type, wrapper(comm))`` register the wrapper
    where c10d can take it, and fail clearly where it cannot (``wrapper``:
    ``_BackendWrapper``; ``adapter``: ``backend_adapter.ADAPTER``).

    c10d's ``ProcessGroup._register_backend`` takes a C++ ``Backend``, and a wrapper is a
    whole ``ProcessGroup``. Where a Python class can be a ``Backend``
    (``torch_compat.PYTHON_C10D_BACKEND``), ``adapter(wrapper)`` is registered in its place,
    so the group's operations run on the communicator. Elsewhere ``Backend`` has no Python
    constructor and the call raises: pybind's own refusal lists C++ signatures; this says
    what works instead. Every other call goes to c10d untouched.
    """
    original = ProcessGroup._register_backend
    if getattr(original, "__torchcomms_guard__", False):
        return
    release = ".".join(str(n) for n in torch_compat.RELEASE)

    def _register_backend(
        self: Any,
        device: Any,
        backend_type: Any,
        backend: Any = None,
    ) -> Any:
        if isinstance(backend, wrapper):
            if adapter is None or not torch_compat.PYTHON_C10D_BACKEND:
                raise CommTypeError(
                    "ProcessGroup._register_backend: a torchcomms _BackendWrapper is a whole "
                    f"ProcessGroup, not a c10d Backend, and torch {release} offers no way to "
                    "build a Backend from Python. Use the wrapper itself as the group: "
                    "torchcomms.device_mesh._create_torchcomm_process_group(comm, group_name), "
                    "or init_process_group/new_group with TORCH_DISTRIBUTED_USE_TORCHCOMMS=1"
                )
            backend = adapter(backend)
        return original(self, device, backend_type, backend)

    _register_backend.__torchcomms_guard__ = True  # type: ignore[attr-defined]
    _register_backend.__doc__ = original.__doc__
    ProcessGroup._register_backend = _register_backend  # type: ignore[method-assign]
