"""Backend registry: in-process registrations plus lazy entry-point discovery.

``new_comm("gloo", ...)`` imports the distribution registered under ``gloo`` in the
``torchcomms.backends`` entry-point group, and nothing else. The lookup is the plugin
host's one :class:`~torchcomms_core.plugin_host.registry.EntryPointRegistry` (``BACKENDS``);
this module gives it the backend spec's checks and the reference's top-level helpers.
"""

from __future__ import annotations

import importlib.metadata as metadata
import inspect
from collections.abc import Callable
from typing import Any

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import BackendLoadError, CommTypeError, TorchCommError
from torchcomms_core.plugin_host.registry import (
    ClassCheck,
    EntryPointRegistry,
    PluginEntry,
    runs_here,
)
from torchcomms_core.spec import (
    SPEC_VERSION,
    TorchCommBackend,
    backend_class_problems,
    method_support,
)

BACKENDS_GROUP = "torchcomms.backends"

#: Distributions that provide the backends users ask for most.
KNOWN_DISTRIBUTIONS: dict[str, str] = {
    "gloo": "torchcomms-gloo",
    "ncclx": "torchcomms-ncclx",
    "nccl": "torchcomms-ncclx",
    "rccl": "torchcomms-rccl",
    "mpi": "torchcomms-mpi",
    "examplevendor": "torchcomms-examplevendor",
}


#: Where a backend comes from (see :class:`~torchcomms_core.plugin_host.registry.PluginEntry`).
BackendEntry = PluginEntry

#: The backends by name: in-process registrations, then the ``torchcomms.backends`` group.
BACKENDS: EntryPointRegistry[TorchCommBackend] = EntryPointRegistry(
    group=BACKENDS_GROUP,
    kind="backend",
    check=ClassCheck(
        TorchCommBackend,
        SPEC_VERSION,
        base_name="torchcomms.TorchCommBackend",
        problems=backend_class_problems,
        docs="docs/writing-a-backend.md (required and optional methods)",
    ),
    known_distributions=KNOWN_DISTRIBUTIONS,
    override_var=_env.BACKEND_OVERRIDE,
    read_overrides=_env.backend_overrides,
    alternative=(
        ", or register a class in-process with torchcomms.register_backend({name!r}, cls)"
    ),
    caller="new_comm",
)
# The registry's own tables, by their old names (tests save and restore loaded classes).
_registered = BACKENDS._registered
_loaded = BACKENDS._loaded


def register_backend(
    name: str, backend_class: type[TorchCommBackend], *, override: bool = False
) -> None:
    """Register ``backend_class`` under ``name`` for this process (tests, notebooks)."""
    BACKENDS.register(name, backend_class, override=override)


def unregister_backend(name: str) -> None:
    """Remove an in-process registration (entry points are unaffected)."""
    BACKENDS.unregister(name)


def entry_points() -> dict[str, BackendEntry]:
    """Installed backends by name, read from distribution metadata (nothing is imported).

    When several distributions register one name, a built-in name keeps its own
    distribution (see ``KNOWN_DISTRIBUTIONS``) unless ``TORCHCOMM_BACKEND_OVERRIDE``
    names another; the rest are listed in ``others``.
    """
    return BACKENDS.entry_points()


def conflict_message(entry: BackendEntry) -> str:
    """What to tell the user about a name several distributions register (or an override)."""
    return BACKENDS.conflict_message(entry)


def available_backends() -> list[str]:
    """Names accepted by ``new_comm``: registered in-process or installed as plugins."""
    return BACKENDS.names()


def get_backend_class(name: str) -> type[TorchCommBackend]:
    """Return the backend class for ``name``, importing only that plugin."""
    return BACKENDS.get(name, stacklevel=4)


def _not_found_message(name: str) -> str:
    return BACKENDS.not_found_message(name)


def describe_backends() -> list[dict[str, Any]]:
    """One record per backend name (entry points and in-process registrations), its plugin
    imported to ask it: where it comes from, other distributions that register the name,
    and the class's spec, devices, whether it runs here, its operations, hint keys and
    algorithms; a backend that fails to load is ``broken``, with the reason."""
    from torchcomms_core.spec import DERIVABLE_METHODS, OPTIONAL_METHODS, REQUIRED_METHODS

    spec_ops = {*REQUIRED_METHODS, *DERIVABLE_METHODS, *OPTIONAL_METHODS}

    def about(name: str, entry: BackendEntry | None) -> dict[str, Any]:
        return {
            # Other distributions registering the same name, and what is done about it.
            "also_registered_by": [e.provider for e in entry.others] if entry else [],
            "conflict": (
                conflict_message(entry)
                if entry and (entry.others or entry.choice != "only")
                else ""
            ),
        }

    def loaded(cls: type[TorchCommBackend]) -> dict[str, Any]:
        runnable, reason = runs_here(cls)
        support = method_support(cls)
        return {
            "broken": False,
            "spec_version": cls.spec_version,
            "devices": list(cls.devices),
            "runnable": runnable,
            "reason": "" if runnable else reason,
            "native": sorted(m for m, v in support.items() if v == "native" and m in spec_ops),
            "derived": sorted(m for m, v in support.items() if v == "derived" and m in spec_ops),
            # Collectives that plugins add: the backend's own method, or the plugin's.
            "plugin_collectives": {m: v for m, v in support.items() if m not in spec_ops},
            # The hint keys the backend reads (``None``: it does not declare them).
            "hint_keys": list(cls.hint_keys) if cls.hint_keys is not None else None,
            # The algorithms it declares per operation, with their default rule (#45).
            "algorithms": {
                op: {k: v for k, v in entry.items() if k != "support"}
                for op, entry in method_support(cls, algorithms=True).items()
                if isinstance(entry, dict)
            },
        }

    def failed(exc: Exception) -> dict[str, Any]:
        return {
            "spec_version": "?",
            "devices": [],
            "runnable": False,
            "broken": True,
            "reason": f"failed to load: {exc}",
            "native": [],
            "derived": [],
            "plugin_collectives": {},
            "hint_keys": None,
            "algorithms": {},
        }

    return BACKENDS.describe(loaded, failed, about=about)


# -- the reference's top-level helpers ----------------------------------------------------


def is_backend_built(backend: str) -> bool:
    """Tell whether a backend of that name is installed (an entry point) or registered."""
    return BACKENDS.is_known(backend) or backend in entry_points()


def built_backends() -> list[str]:
    """Names of the installed backends (entry points of ``torchcomms.backends``)."""
    return sorted(entry_points())


def is_backend_registered(name: str) -> bool:
    """Tell whether ``name`` is registered in-process or its plugin is already loaded
    (the reference's ``torchcomms._comms._is_backend_registered``)."""
    return BACKENDS.is_known(name)


def load_backend(backend: str) -> None:
    """Load the entry point named ``backend``; ``ModuleNotFoundError`` if there is none
    (the reference's ``torchcomms._load_backend``)."""
    if not isinstance(backend, str):
        raise CommTypeError(
            f"torchcomms._load_backend: backend must be a str, got {backend!r}; pass a "
            f"backend's name (torchcomms.built_backends() lists the installed ones)"
        )
    if BACKENDS.is_known(backend):
        return
    if backend not in entry_points():
        raise ModuleNotFoundError(_not_found_message(backend), name=backend)
    get_backend_class(backend)


def backend_version(cls: type[TorchCommBackend]) -> str:
    """A backend class's version: ``cls.version``, else its distribution's, else torch's."""
    declared = getattr(cls, "version", None)
    if isinstance(declared, str) and declared:
        return declared
    package = cls.__module__.split(".", 1)[0]
    for dist_name in metadata.packages_distributions().get(package, []):
        try:
            return metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            continue
    import torch

    return f"torch {torch.__version__}"


def get_mem_allocator(backend: str) -> Any:
    """The process-wide memory allocator of ``backend`` (for ``torch.cuda.MemPool``).

    Only backends that manage device memory have one; they expose it as a
    ``process_mem_allocator()`` classmethod (no communicator needed), or as a
    ``get_mem_allocator`` that is a classmethod or staticmethod. An instance method of
    that name belongs to one communicator and is not called here.
    """
    cls = get_backend_class(backend)
    allocator = getattr(cls, "process_mem_allocator", None)
    if allocator is None:
        static = inspect.getattr_static(cls, "get_mem_allocator", None)
        if isinstance(static, (classmethod, staticmethod)):
            allocator = getattr(cls, "get_mem_allocator")  # noqa: B009 - not on the spec
    if allocator is None:
        raise BackendLoadError(
            f"get_mem_allocator: backend {backend!r} has no memory allocator; allocators "
            f"exist for GPU backends that register memory with the network (the reference's "
            f"ncclx), for use with torch.cuda.MemPool. CPU tensors need none: allocate them "
            f"as usual"
        )
    return allocator()


def backend_module_getattr(module: str, classes: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that gives the reference's per-backend class names
    (``torchcomms._comms_gloo.TorchCommGloo``) the installed backend's class, loaded on
    first use by its backend name (``classes``: class name -> backend name)."""

    def __getattr__(item: str) -> Any:
        backend = classes.get(item)
        if backend is None:
            raise AttributeError(f"module {module!r} has no attribute {item!r}")
        try:
            return get_backend_class(backend)
        except TorchCommError as exc:
            raise AttributeError(
                f"{module}.{item} is the class of backend {backend!r}, which is not "
                f"available here: {exc}"
            ) from exc

    return __getattr__
