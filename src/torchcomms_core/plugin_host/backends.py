"""Backend registry: in-process registrations plus lazy entry-point discovery.

``new_comm("gloo", ...)`` imports the distribution registered under ``gloo`` in the
``torchcomms.backends`` entry-point group, and nothing else.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import inspect
import re
import threading
import warnings
from collections.abc import Callable
from typing import Any, cast

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import (
    BackendLoadError,
    BackendNotFoundError,
    CommTypeError,
    TorchCommError,
)
from torchcomms_core.spec import TorchCommBackend, backend_class_problems, check_spec_version

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


@dataclasses.dataclass(frozen=True)
class BackendEntry:
    """Where a backend comes from: an entry point or an in-process registration.

    ``others`` lists further distributions that register the same name; ``choice`` says
    why this one is used: ``"only"``, ``"built-in"``, ``"override"`` or ``"ambiguous"``
    (several candidates and no rule to pick one: :func:`get_backend_class` refuses it).
    """

    name: str
    value: str
    distribution: str | None
    version: str | None
    entry_point: Any = None
    others: tuple[BackendEntry, ...] = ()
    choice: str = "only"

    @property
    def provider(self) -> str:
        """``"distribution version"``, as messages and ``torchcomms backends`` show it."""
        return f"{self.distribution or 'an unknown distribution'} {self.version or ''}".strip()


_lock = threading.Lock()
_registered: dict[str, type[TorchCommBackend]] = {}
_loaded: dict[str, type[TorchCommBackend]] = {}


def register_backend(
    name: str, backend_class: type[TorchCommBackend], *, override: bool = False
) -> None:
    """Register ``backend_class`` under ``name`` for this process (tests, notebooks)."""
    if not isinstance(name, str) or not name:
        raise CommTypeError(f"register_backend: name must be a non-empty string, got {name!r}")
    _check_backend_class(backend_class, f"backend class {backend_class!r} registered as {name!r}")
    with _lock:
        existing = _registered.get(name)
        if existing is not None and existing is not backend_class and not override:
            raise ValueError(
                f"register_backend: {name!r} is already registered to {existing.__qualname__}; "
                f"call unregister_backend({name!r}) first or pass override=True"
            )
        _registered[name] = backend_class


def unregister_backend(name: str) -> None:
    """Remove an in-process registration (entry points are unaffected)."""
    with _lock:
        _registered.pop(name, None)


def _normalized(dist: str | None) -> str:
    return re.sub(r"[-_.]+", "-", dist or "").lower()


def _overrides() -> dict[str, str]:
    try:
        return _env.backend_overrides()
    except ValueError as exc:
        raise BackendLoadError(str(exc)) from None


def entry_points() -> dict[str, BackendEntry]:
    """Installed backends by name, read from distribution metadata (nothing is imported).

    When several distributions register one name, a built-in name keeps its own
    distribution (see ``KNOWN_DISTRIBUTIONS``) unless ``TORCHCOMM_BACKEND_OVERRIDE``
    names another; the rest are listed in ``others``.
    """
    candidates: dict[str, list[BackendEntry]] = {}
    for ep in metadata.entry_points(group=BACKENDS_GROUP):
        dist = getattr(ep, "dist", None)
        entry = BackendEntry(
            name=ep.name,
            value=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
            entry_point=ep,
        )
        same = candidates.setdefault(ep.name, [])
        # One distribution seen twice (e.g. on two path entries) is not a conflict.
        if not any(
            _normalized(e.distribution) == _normalized(entry.distribution)
            and e.value == entry.value
            for e in same
        ):
            same.append(entry)
    overrides = _overrides()
    return {name: _choose(name, found, overrides.get(name)) for name, found in candidates.items()}


def _choose(name: str, found: list[BackendEntry], override: str | None) -> BackendEntry:
    def pick(entry: BackendEntry, choice: str) -> BackendEntry:
        others = tuple(e for e in found if e is not entry)
        return dataclasses.replace(entry, others=others, choice=choice)

    if override is not None:
        for entry in found:
            if _normalized(entry.distribution) == _normalized(override):
                return pick(entry, "override")
        return pick(found[0], "ambiguous")  # the override names nothing installed
    if len(found) == 1:
        return found[0]
    own = KNOWN_DISTRIBUTIONS.get(name)
    for entry in found:
        if own is not None and _normalized(entry.distribution) == _normalized(own):
            return pick(entry, "built-in")
    return pick(found[0], "ambiguous")


def _conflict_message(entry: BackendEntry) -> str:
    """What to tell the user about a name several distributions register (or an override)."""
    name, var = entry.name, _env.BACKEND_OVERRIDE
    everyone = [entry, *entry.others]
    listing = " and ".join(e.provider for e in everyone)
    override = _overrides().get(name)
    if entry.choice == "ambiguous" and override is not None:
        return (
            f"{var} asks for backend {name!r} from {override!r}, but it is provided only by "
            f"{listing}; set {var}={name}=<one of those distributions> or install {override}"
        )
    if entry.choice == "ambiguous":
        return (
            f"backend {name!r} is registered by {listing}, and none of them is its built-in "
            f"provider; choose one with {var}={name}={everyone[0].distribution} (for "
            f"example), or uninstall the others"
        )
    ignored = ", ".join(e.provider for e in entry.others)
    why = "its built-in provider" if entry.choice == "built-in" else f"chosen by {var}"
    hint = (
        f"; to use another one set {var}={name}=<distribution>, or uninstall {ignored}"
        if entry.choice == "built-in"
        else ""
    )
    return (
        f"backend {name!r} is registered by {listing}; using {entry.provider} ({why}) and "
        f"ignoring {ignored}{hint}"
    )


def available_backends() -> list[str]:
    """Names accepted by ``new_comm``: registered in-process or installed as plugins."""
    with _lock:
        names = set(_registered)
    names.update(entry_points())
    return sorted(names)


def get_backend_class(name: str) -> type[TorchCommBackend]:
    """Return the backend class for ``name``, importing only that plugin."""
    with _lock:
        cls = _registered.get(name) or _loaded.get(name)
    if cls is not None:
        return cls
    entry = entry_points().get(name)
    if entry is None:
        raise BackendNotFoundError(_not_found_message(name))
    if entry.choice == "ambiguous":
        raise BackendLoadError(f"new_comm: {_conflict_message(entry)}")
    if entry.choice == "built-in":
        warnings.warn(f"torchcomms: {_conflict_message(entry)}", RuntimeWarning, stacklevel=3)
    who = f"backend {name!r} from {entry.provider}"
    try:
        cls = entry.entry_point.load()
    except Exception as exc:
        raise BackendLoadError(_import_failure(entry, who, exc)) from exc
    _check_backend_class(cls, who)  # raises unless cls is a TorchCommBackend subclass
    with _lock:
        _loaded[name] = cls
    return cast(type[TorchCommBackend], cls)


def _import_failure(entry: BackendEntry, who: str, exc: Exception) -> str:
    """Why the entry point of ``entry`` did not load, and what fixes it."""
    module, _, attr = entry.value.partition(":")
    module = module.strip()
    section = f'[project.entry-points."{BACKENDS_GROUP}"]'
    fix_entry = (
        f"fix the entry point {entry.name} = {entry.value!r} in the {section} section of "
        f"{entry.distribution or 'its distribution'}'s pyproject.toml, then reinstall it "
        f"(pip install -e . while developing)"
    )
    if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
        return (
            f"{who}: its entry point {entry.value!r} names module {module!r}, which does not "
            f"exist ({exc}); {fix_entry}"
        )
    if isinstance(exc, AttributeError) and attr:
        return (
            f"{who}: its entry point {entry.value!r} names {attr.strip()!r}, which module "
            f"{module!r} does not define ({exc}); {fix_entry}"
        )
    return (
        f"{who} failed to import ({type(exc).__name__}: {exc}); the error is raised by the "
        f"plugin's own code (see the traceback), or a dependency of it is missing. Fix "
        f"or reinstall {entry.distribution or entry.name}, or uninstall it; other backends "
        f"keep working"
    )


def _check_backend_class(cls: Any, who: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TorchCommBackend)):
        raise BackendLoadError(
            f"{who} is {cls!r}, not a subclass of torchcomms.TorchCommBackend; "
            f"the entry point must name the backend class"
        )
    check_spec_version(getattr(cls, "spec_version", "0.0"), who)
    problems = backend_class_problems(cls)
    if problems:
        raise BackendLoadError(
            f"{who}: class {cls.__module__}.{cls.__qualname__} does not meet the backend spec: "
            + "; ".join(problems)
            + ". See docs/writing-a-backend.md (required and optional methods)"
        )


def _not_found_message(name: str) -> str:
    installed = available_backends()
    listing = ", ".join(repr(n) for n in installed) if installed else "none"
    dist = KNOWN_DISTRIBUTIONS.get(name)
    if dist is not None:
        hint = f"install it with `pip install {dist}`"
    else:
        hint = (
            f"install the distribution that provides it (it must register {name!r} in the "
            f"{BACKENDS_GROUP!r} entry-point group), or register a class in-process with "
            f"torchcomms.register_backend({name!r}, cls)"
        )
    return (
        f"failed to find backend {name!r}: no torchcomms backend named {name!r} is "
        f"installed (installed: {listing}); {hint}"
    )


# -- the reference's top-level helpers ----------------------------------------------------


def is_backend_built(backend: str) -> bool:
    """Tell whether a backend of that name is installed (an entry point) or registered."""
    with _lock:
        if backend in _registered or backend in _loaded:
            return True
    return backend in entry_points()


def built_backends() -> list[str]:
    """Names of the installed backends (entry points of ``torchcomms.backends``)."""
    return sorted(entry_points())


def _is_backend_registered(name: str) -> bool:
    """Tell whether ``name`` is registered in-process or its plugin is already loaded."""
    with _lock:
        return name in _registered or name in _loaded


def _load_backend(backend: str) -> None:
    """Load the entry point named ``backend``; ``ModuleNotFoundError`` if there is none."""
    if not isinstance(backend, str):
        raise CommTypeError(f"_load_backend: backend must be a str, got {backend!r}")
    with _lock:
        if backend in _registered or backend in _loaded:
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
