"""Backends c10d knows and torchcomms does not: served through the c10d adapter.

``torch.distributed.Backend.register_backend(name, creator)`` makes ``name`` a c10d
backend (ucc, hccl, mooncake, a vendor's own, the ``dummy`` and ``threaded`` backends of
PyTorch's tests). Under ``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1`` PyTorch hands every backend
name but ``fake`` to ``torchcomms.new_comm``; a name no torchcomms backend provides then
gets a :class:`C10dRegisteredBackend` subclass, whose engine is what the registered
creator returns, called exactly as c10d calls it (``(store, rank, size, timeout)``, or
the extended API's ``(_DistributedBackendOptions, backend_options)``). The group then
computes what it computes without the switch, and torchcomms' hooks, flight recorder and
wrapper see every call.

The engine may be a c10d ``Backend`` (what ucc or hccl return) or a whole
``ProcessGroup`` (Python backends such as the ``threaded`` one); both take c10d's calls.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, ClassVar, cast

import torch

from torchcomms_core.creation.group_record import current_group
from torchcomms_core.engines.c10d_engine import C10dBackend, c10d_module

if TYPE_CHECKING:
    from torchcomms_core.operations.options import CommOptions

#: The Python-level names of c10d's flat collectives (``C10dBackend._flat_op``).
_PYTHON_GROUP_NAMES = {
    "_allgather_base": "all_gather_single",
    "_reduce_scatter_base": "reduce_scatter_single",
    "alltoall_base": "all_to_all_single",
}

_lock = threading.Lock()
# One class per registered name, remade when c10d's registration changes.
_classes: dict[str, type[C10dRegisteredBackend]] = {}


class C10dRegisteredBackend(C10dBackend):
    """A torchcomms backend over the engine a c10d-registered creator builds.

    Subclassed once per name by :func:`c10d_registered_backend`; ``c10d_name`` and
    ``c10d_plugin`` say which registration it serves.
    """

    #: The name the backend was registered under in c10d (as given to ``new_comm``).
    c10d_name: ClassVar[str] = ""
    #: c10d's ``Backend._BackendPlugin`` record: the creator and whether it takes the
    #: extended API.
    c10d_plugin: ClassVar[Any] = None
    # c10d waits for a registered backend's works without a limit of its own (the
    # engine applies the timeout its creator was given); Python engines' works refuse a
    # timed wait.
    timed_waits: ClassVar[bool] = False
    #: ``new_comm`` states the c10d group being created while ``init`` runs (see
    #: ``_c10d_group.current_group``): the extended API hands its facts to the creator.
    reads_c10d_group: ClassVar[bool] = True

    def __init__(self) -> None:
        super().__init__()
        # The members' global ranks, which the extended API hands the creator.
        self._global_ranks: list[int] = []

    def create_engine(
        self,
        store: Any,
        rank: int,
        size: int,
        timeout: timedelta,
        device: torch.device,
        options: CommOptions,
    ) -> Any:
        plugin = self.c10d_plugin
        group = current_group()
        if group is not None and not self._global_ranks:
            # As c10d gives them: empty for the default group (every rank, in order).
            self._global_ranks = list(group.global_ranks)
        if not plugin.extended_api:
            return plugin.creator_fn(store, rank, size, timeout)
        from torch._C._distributed_c10d import _DistributedBackendOptions

        opts = _DistributedBackendOptions()
        opts.store = store
        opts.group_rank = rank
        opts.group_size = size
        opts.timeout = timeout
        opts.group_id = cast(Any, options.name)  # a str; 2.14 types it GroupName
        opts.global_ranks_in_group = list(self._global_ranks)
        return plugin.creator_fn(opts, group.backend_options if group is not None else None)

    def get_backend_name(self) -> str:
        return self.c10d_name

    def _flat_op(self, name: str) -> Any:
        # A whole ProcessGroup written in Python (the ``threaded`` one) implements c10d's
        # Python-level names, which c10d's own calls reach it by; its C++ base's
        # ``_allgather_base`` family would not reach its code.
        if isinstance(self._engine, c10d_module().ProcessGroup):
            name = _PYTHON_GROUP_NAMES[name]
        return getattr(self._engine, name)

    def split(
        self, ranks: list[int], name: str, options: CommOptions
    ) -> C10dRegisteredBackend | None:
        """A child built by the same creator on the child's store, as c10d builds a
        ``new_group`` of this backend; non-members (``ranks == []``) get ``None``."""
        if not ranks:
            return None
        child = type(self)()
        parent = self._global_ranks or list(range(self.get_size()))
        child._global_ranks = [parent[r] for r in ranks]
        child._bind(self.device, name, options)
        child.init(self.device, name, options)
        return child


def c10d_registered_backend(name: str) -> type[C10dRegisteredBackend] | None:
    """The backend class serving ``name`` through the c10d adapter, when c10d has a
    backend registered under ``name`` (``Backend.register_backend``); else ``None``.

    Only registrations c10d keeps as plugins count: its built-in names (gloo, nccl, mpi,
    ucc built in, fake) are not creators torchcomms can call.
    """
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    if c10d is None or not isinstance(name, str):
        return None
    plugins = getattr(c10d.Backend, "_plugins", {})
    plugin = plugins.get(name.upper())
    # Our own registrations (torchcomms_core.c10d.names) lead back to new_comm: a
    # torchcomms backend that did not load is not served by itself.
    if plugin is None or getattr(plugin.creator_fn, "torchcomms_backend", None):
        return None
    with _lock:
        cls = _classes.get(name)
        if cls is not None and cls.c10d_plugin is plugin:
            return cls
        capability: Sequence[str] = c10d.Backend.backend_capability.get(
            name.lower(), ("cpu", "cuda")
        )
        cls = type(
            f"C10dRegistered[{name}]",
            (C10dRegisteredBackend,),
            {
                "c10d_name": name,
                "c10d_plugin": plugin,
                "devices": tuple(str(d) for d in capability),
                "__doc__": f"c10d's registered backend {name!r}, served through the adapter.",
                "__module__": __name__,
            },
        )
        _classes[name] = cls
        return cls


__all__ = ["C10dRegisteredBackend", "c10d_registered_backend"]
