"""Backend registry: in-process registrations plus lazy entry-point discovery.

``new_comm("gloo", ...)`` imports the distribution registered under ``gloo`` in the
``torchcomms.backends`` entry-point group, and nothing else.
"""

from __future__ import annotations

import importlib.metadata as metadata
import threading
from dataclasses import dataclass
from typing import Any

from .errors import BackendLoadError, BackendNotFoundError, CommTypeError
from .spec import TorchCommBackend, check_spec_version

BACKENDS_GROUP = "torchcomms.backends"

#: Distributions that provide the backends users ask for most.
KNOWN_DISTRIBUTIONS: dict[str, str] = {
    "gloo": "torchcomms-gloo",
    "ncclx": "torchcomms-ncclx",
    "nccl": "torchcomms-ncclx",
    "rccl": "torchcomms-rccl",
    "examplevendor": "torchcomms-examplevendor",
}


@dataclass(frozen=True)
class BackendEntry:
    """Where a backend comes from: an entry point or an in-process registration."""

    name: str
    value: str
    distribution: str | None
    version: str | None
    entry_point: Any = None


_lock = threading.Lock()
_registered: dict[str, type[TorchCommBackend]] = {}
_loaded: dict[str, type[TorchCommBackend]] = {}


def register_backend(name: str, backend_class: type[TorchCommBackend], *,
                     override: bool = False) -> None:
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


def entry_points() -> dict[str, BackendEntry]:
    """Installed backends by name, read from distribution metadata (nothing is imported)."""
    found: dict[str, BackendEntry] = {}
    for ep in metadata.entry_points(group=BACKENDS_GROUP):
        dist = getattr(ep, "dist", None)
        found.setdefault(ep.name, BackendEntry(
            name=ep.name,
            value=ep.value,
            distribution=dist.metadata["Name"] if dist is not None else None,
            version=dist.version if dist is not None else None,
            entry_point=ep,
        ))
    return found


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
    who = f"backend {name!r} from {entry.distribution or 'an unknown distribution'}" + (
        f" {entry.version}" if entry.version else "")
    try:
        cls = entry.entry_point.load()
    except Exception as exc:
        raise BackendLoadError(
            f"{who} failed to import ({type(exc).__name__}: {exc}); reinstall it with "
            f"`pip install --force-reinstall {entry.distribution or name}` or uninstall it; "
            f"other backends keep working"
        ) from exc
    _check_backend_class(cls, who)
    with _lock:
        _loaded[name] = cls
    return cls


def _check_backend_class(cls: Any, who: str) -> None:
    if not (isinstance(cls, type) and issubclass(cls, TorchCommBackend)):
        raise BackendLoadError(
            f"{who} is {cls!r}, not a subclass of torchcomms.TorchCommBackend; "
            f"the entry point must name the backend class"
        )
    check_spec_version(getattr(cls, "spec_version", "0.0"), who)


def _not_found_message(name: str) -> str:
    installed = available_backends()
    listing = ", ".join(repr(n) for n in installed) if installed else "none"
    dist = KNOWN_DISTRIBUTIONS.get(name)
    if dist is not None:
        hint = f"install it with `pip install {dist}`"
    else:
        hint = (f"install the distribution that provides it (it must register {name!r} in the "
                f"{BACKENDS_GROUP!r} entry-point group), or register a class in-process with "
                f"torchcomms.register_backend({name!r}, cls)")
    return f"no torchcomms backend named {name!r} is installed (installed: {listing}); {hint}"
