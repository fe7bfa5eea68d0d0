"""Every installed torchcomms backend as a ``torch.distributed`` backend, by its name.

``register_c10d_backends()`` registers each torchcomms backend (entry points of
``torchcomms.backends`` and in-process registrations) with c10d through its public
``Backend.register_backend``, so ``init_process_group("shm")``,
``new_group(backend="hier")`` and ``"cpu:shm"`` work:

- with PyTorch's switch (``TORCH_DISTRIBUTED_USE_TORCHCOMMS=1``) the name is known to c10d
  and reaches ``torchcomms.new_comm`` through the switch's own path;
- without it, c10d calls the creator registered here (the extended API), which builds a
  communicator over c10d's store with c10d's rank, size, timeout and group name and returns
  the same ``_BackendWrapper`` the switch would, with the flight recorder when c10d's buffer
  size asks for one.

Names c10d owns (``gloo``, ``nccl``, ``mpi``, ``ucc``, ``xccl``, ``fake``) are never
registered: without the switch they keep c10d's meaning, with it they go to our plugins as
before. A name another library already registered with c10d is left to it.

Each backend's devices are read from its class the first time c10d asks for them
(``Backend.backend_capability``), so registering imports no plugin: what the registration
costs ``import torch`` is one read of the installed entry points (docs/pytorch-integration.md
gives the figure).
"""

from __future__ import annotations

import contextlib
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any, SupportsIndex, cast

import torch

from torchcomms_core.c10d.backend_wrapper import _BackendWrapper
from torchcomms_core.comm.create import new_comm
from torchcomms_core.creation.group_record import GroupContext, creating_device, given_group
from torchcomms_core.creation.pg_options import hints_from_pg_options
from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation import torch_compat
from torchcomms_core.foundation.errors import (
    BackendLoadError,
    BackendNotFoundError,
    CommInputError,
    CommTypeError,
)
from torchcomms_core.hooks.flight_recorder import FlightRecorderHook
from torchcomms_core.plugin_host.backends import BACKENDS, get_backend_class

__all__ = [
    "C10D_OWNED",
    "autoload_names",
    "c10d_backend_names",
    "c10d_entry_point_names",
    "register_c10d_backend",
    "register_c10d_backends",
]

#: Names c10d gives a meaning of its own; never registered by us.
C10D_OWNED = frozenset({"undefined", "gloo", "nccl", "ucc", "mpi", "xccl", "fake"})
# What a c10d backend name may be: c10d splits "device:backend,device:backend" strings and
# stores names in upper and lower case.
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

_lock = threading.Lock()
# The names registered by us in this process.
_ours: set[str] = set()


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


def c10d_backend_names() -> dict[str, str]:
    """``{name: provider}`` of every torchcomms backend installed or registered in this
    process, the provider as ``"distribution version"`` (``"registered in-process"`` for a
    ``register_backend`` class)."""
    found = {name: entry.provider for name, entry in BACKENDS.entry_points().items()}
    for name in BACKENDS.in_process_names():
        found.setdefault(name, "registered in-process")
    return dict(sorted(found.items()))


class _Devices(list[str]):
    """A backend's devices as c10d's ``Backend.backend_capability`` holds them, read from the
    backend class the first time c10d looks (so registering imports no plugin).

    The available accelerator comes first: a plain ``init_process_group("hier")`` on a GPU
    machine serves the GPU, as ``"nccl"`` would, and ``"cpu:hier"`` still selects the CPU.
    A class that cannot load gives ``["cpu"]``: the creator then raises its load error.
    """

    def __init__(self, name: str) -> None:
        super().__init__()
        self.backend = name
        self._filled = False

    def _fill(self) -> None:
        if self._filled:
            return
        self._filled = True
        try:
            devices = [str(d) for d in get_backend_class(self.backend).devices]
        except Exception:
            devices = ["cpu"]
        accelerator = torch._C._get_accelerator().type
        if accelerator != "cpu" and accelerator in devices:
            devices.remove(accelerator)
            devices.insert(0, accelerator)
        super().extend(devices)

    def __iter__(self) -> Iterator[str]:
        self._fill()
        return super().__iter__()

    def __len__(self) -> int:
        self._fill()
        return super().__len__()

    def __contains__(self, item: object) -> bool:
        self._fill()
        return super().__contains__(item)

    def __getitem__(self, index: Any) -> Any:
        self._fill()
        return super().__getitem__(cast(SupportsIndex, index))

    def __eq__(self, other: object) -> bool:
        self._fill()
        return super().__eq__(other)

    __hash__ = None

    def __repr__(self) -> str:
        self._fill()
        return super().__repr__()


def _create(backend: str, opts: Any, pg_options: Any) -> _BackendWrapper:
    """c10d's extended-API creator for ``backend``: a communicator over c10d's store."""
    rank, size = int(opts.group_rank), int(opts.group_size)
    timeout = opts.timeout
    hints = hints_from_pg_options(backend, pg_options)
    try:
        entries = _env.c10d_recorder_entries()
    except ValueError as exc:
        raise CommInputError(str(exc)) from None
    device = creating_device()
    if device is None:
        devices = cast(Any, _c10d().Backend.backend_capability.get(backend, ["cpu"]))
        device = next(iter(devices), "cpu")
    hints.setdefault("persistent_store", "true")
    global_ranks = tuple(int(r) for r in (opts.global_ranks_in_group or ()))
    context = GroupContext(rank, size, timeout, global_ranks, None, pg_options)
    with given_group(context):
        comm = new_comm(
            backend,
            torch.device(device),
            name=str(opts.group_id),
            store=opts.store,
            timeout=timeout,
            hints=hints,
        )
    if entries > 0:
        FlightRecorderHook(max_entries=entries).register_with_comm(comm)
    return _BackendWrapper(comm)


def _creator(backend: str) -> Any:
    def create(opts: Any, pg_options: Any = None) -> _BackendWrapper:
        return _create(backend, opts, pg_options)

    create.__name__ = f"create_{backend}"
    create.__qualname__ = create.__name__
    create.__doc__ = f"Build a process group on torchcomms backend {backend!r} (c10d's creator)."
    # c10d_registered.c10d_registered_backend leaves our own registrations alone.
    create.torchcomms_backend = backend  # type: ignore[attr-defined]
    return create


def register_c10d_backend(name: str) -> bool:
    """Register torchcomms backend ``name`` with c10d; ``False`` when c10d owns the name,
    another library registered it, or it is not a valid c10d name."""
    if not isinstance(name, str):
        raise CommTypeError(f"register_c10d_backend: name must be a str, got {name!r}")
    if name in C10D_OWNED or not _NAME.match(name):
        return False
    c10d = _c10d()
    Backend = c10d.Backend
    with _lock:
        plugin = Backend._plugins.get(name.upper())
        if plugin is not None:
            return getattr(plugin.creator_fn, "torchcomms_backend", None) == name
        Backend.register_backend(name, _creator(name), extended_api=True, devices=[])
        Backend.backend_capability[name] = _Devices(name)
        _ours.add(name)
    return True


def register_c10d_backends() -> list[str]:
    """Register every installed torchcomms backend with c10d; return the names registered.

    Runs at ``import torch`` through torch's device-backend autoload (opt out with
    ``TORCHCOMM_C10D_AUTOLOAD=0``, or torch's ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``); call it
    again after ``torchcomms.register_backend`` to make an in-process backend a c10d name.
    """
    return [name for name in c10d_backend_names() if register_c10d_backend(name)]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def c10d_entry_point_names() -> frozenset[str]:
    """The names c10d can resolve itself, through the entry-point group
    ``torch.distributed.backends`` (torch 2.14 and later; empty before)."""
    if not torch_compat.C10D_BACKEND_ENTRY_POINTS:
        return frozenset()
    from importlib import metadata

    return frozenset(ep.name for ep in metadata.entry_points(group="torch.distributed.backends"))


def autoload_names() -> list[str]:
    """The names the autoload registers at ``import torch``: every installed torchcomms
    backend on torch 2.13; on 2.14, only those whose distribution publishes no
    ``torch.distributed.backends`` entry point (c10d finds the others when a group first
    names them, so a backend installed and not used leaves c10d's lists as they were).
    ``TORCHCOMM_C10D_AUTOLOAD=shm,hier`` keeps only the names it lists."""
    published = c10d_entry_point_names()
    chosen = _env.c10d_autoload_names()
    return [
        name
        for name in c10d_backend_names()
        if name not in published and (chosen is None or name in chosen)
    ]


def autoload_registration() -> None:
    """What torch's autoload and the faces' completion run: register unless opted out,
    never raising (a failure here must not break ``import torch``)."""
    if not _env.c10d_autoload():
        return
    reason = torch_compat.untested_reason()
    if reason:
        print(
            f"torchcomms: backends not registered with torch.distributed: {reason}", file=sys.stderr
        )
        return
    try:
        with _quiet():
            for name in autoload_names():
                register_c10d_backend(name)
    except (BackendLoadError, BackendNotFoundError, ImportError, RuntimeError) as exc:
        print(
            f"torchcomms: could not register torchcomms backends with torch.distributed "
            f"({exc}); init_process_group('<torchcomms backend>') will not find them. Set "
            "TORCHCOMM_C10D_AUTOLOAD=0 to skip this step.",
            file=sys.stderr,
        )
