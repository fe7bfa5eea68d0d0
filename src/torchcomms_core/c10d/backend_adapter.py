"""``BackendAdapter``: a ``_BackendWrapper`` seen by c10d as one of a group's ``Backend``\\s.

``pg._register_backend(device, type, backend)`` takes a c10d ``Backend``, and a wrapper is
a whole ``ProcessGroup``. Where a Python class can be a ``Backend``
(``torch_compat.PYTHON_C10D_BACKEND``), the adapter is registered in its place (see
``engine_access._guard_register_backend``): c10d's trampoline for Python backends calls
the adapter's methods by name, and each one calls the wrapper's method, so the group's
operations run on the communicator, its hooks and checks included, and return the
wrapper's ``Work``.

The operations are made from the wrapper's own table (``ops.OPS``): every name a row
gives the wrapper, the adapter forwards. Elsewhere :data:`ADAPTER` is ``None`` and no
class is defined.

Imported while ``torch.distributed`` is half-initialised (by ``backend_wrapper``), so
nothing here touches ``torch.distributed`` at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from torch._C._distributed_c10d import Backend

from torchcomms_core.c10d.args import timeout_of
from torchcomms_core.c10d.ops import OPS
from torchcomms_core.foundation import torch_compat
from torchcomms_core.foundation.errors import TorchCommError

_RELEASE = ".".join(str(n) for n in torch_compat.RELEASE)

#: What c10d calls on a Python backend, beyond the operations, that the wrapper answers
#: under the same name.
_SAME_NAME = (
    "getBackendName",
    "eager_connect_single_device",
    "supports_tensor_alloc",
    "set_timeout",
    "abort",
    "shutdown",
)

#: c10d's name for a call on a Python backend, and the wrapper's method that answers it.
_RENAMED = {
    # The wrapper's allreduce takes sparse tensors too.
    "allreduce_sparse": "allreduce",
    # A group's coalescing block: c10d passes no device, the wrapper needs none.
    "start_coalescing": "_start_coalescing",
    "end_coalescing": "_end_coalescing",
    # ProcessGroup._set_group_name names each backend so.
    "_set_group_uid": "_set_group_name",
}

#: Capabilities c10d reads as properties of a backend.
_CAPABILITIES = (
    "supports_splitting",
    "supports_coalescing",
    "supports_time_estimate",
    "supports_shrinking",
)


def _forward(name: str, target: str) -> Callable[..., Any]:
    """The adapter method ``name``: the wrapper's ``target`` with the same arguments."""

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.wrapper, target)(*args, **kwargs)

    forward.__name__ = forward.__qualname__ = name
    forward.__doc__ = f"The wrapper's ``{target}``."
    return forward


def _capability(name: str) -> property:
    def read(self: Any) -> bool:
        return bool(getattr(self.wrapper, name))

    read.__name__ = name
    return property(read, doc=f"The wrapper's ``{name}``.")


def _methods() -> dict[str, Any]:
    """Every forwarded method and capability of the adapter, by name."""
    names: dict[str, Any] = {n: _forward(n, n) for op in OPS for n in op.names}
    names.update((n, _forward(n, n)) for n in _SAME_NAME)
    names.update((n, _forward(n, target)) for n, target in _RENAMED.items())
    names.update((n, _capability(n)) for n in _CAPABILITIES)
    return names


#: ``BackendAdapter`` where c10d takes a Python backend, else ``None``.
ADAPTER: Callable[[Any], Backend] | None = None

if torch_compat.PYTHON_C10D_BACKEND:

    class BackendAdapter(Backend):
        """A c10d ``Backend`` whose every call runs on a ``_BackendWrapper``.

        ``pg._get_backend(device)`` of the group it is registered in returns it; what it
        does not define (``get_comm()``, ``group_name``) is the wrapper's.
        """

        # c10d reads every capability (and ``options``) of a Python backend, and torch 2.14
        # answers one a subclass leaves out by reading it again, without end
        # (RecursionError). The wrapper offers neither of these: no c10d window (c10d's
        # Window has no Python constructor), no reconfiguration.
        supports_window = False
        supports_reconfigure = False

        def __init__(self, wrapper: Any) -> None:
            super().__init__(wrapper.rank(), wrapper.size())
            self.wrapper = wrapper

        @property
        def options(self) -> Any:
            """The wrapper's backend options (c10d reads a Python backend's here)."""
            return self.wrapper.options

        def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
            """The wrapper's ``monitored_barrier``: c10d passes barrier options, the wrapper
            takes their timeout."""
            self.wrapper.monitored_barrier(timeout_of(opts), wait_all_ranks)

        def split(self, store: Any, ranks: Any, opts: Any = None) -> BackendAdapter:
            """The wrapper's ``split_group`` (``ProcessGroup.split_group`` asks each backend
            of the group): an adapter over the new group.

            A rank outside ``ranks`` takes its part in the split, then raises: c10d's
            trampoline cannot take ``None`` from a Python backend (it crashes the process),
            so it cannot be told there is no group."""
            name = getattr(opts, "group_name", None) or None
            timeout = getattr(opts, "_timeout", None)
            members = list(ranks)
            child = self.wrapper.split_group(
                members,
                timeout=timeout if isinstance(timeout, timedelta) else None,
                group_name=name,
            )
            if child is None:
                raise TorchCommError(
                    f"ProcessGroup.split_group: rank {self.rank()} is not in {members}. Its "
                    f"part of the split is done, but torch {_RELEASE} cannot be given 'no "
                    "group' by a Python backend; call it through the torchcomms group "
                    "instead, pg._get_backend(device).split_group(ranks), which returns "
                    "None outside the split"
                )
            return BackendAdapter(child)

        def __getattr__(self, name: str) -> Any:
            # Only reached when normal lookup failed; __dict__ keeps this free of
            # recursion before __init__ has set the wrapper.
            wrapper = self.__dict__.get("wrapper")
            if wrapper is None or name.startswith("__"):
                raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
            return getattr(wrapper, name)

        def __repr__(self) -> str:
            return f"<BackendAdapter over {self.wrapper!r}>"

    for _name, _value in _methods().items():
        setattr(BackendAdapter, _name, _value)
    del _name, _value

    ADAPTER = BackendAdapter

__all__ = ["ADAPTER"]
