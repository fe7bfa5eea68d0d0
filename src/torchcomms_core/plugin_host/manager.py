"""The plugin manager: built-ins first, then ``torchcomms.plugins`` entry points.

The entry points are found, settled (one name, several distributions) and imported by the
host's one registry (:data:`COLLECTIVE_PLUGINS`, an ``EntryPointRegistry`` as for
backends, transports and tuners); pluggy then registers each plugin's hooks.
``TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points; ``TORCHCOMM_PLUGINS=a,b``
loads only the named ones. Collectives are collected once and installed on
``TorchComm``; no operation goes through pluggy.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pluggy

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import BackendLoadError, TorchCommError
from torchcomms_core.operations.table import OPS
from torchcomms_core.plugin_host import hookspecs
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.plugin_host.registry import EntryPointRegistry, PluginEntry
from torchcomms_core.spec import set_collective_source

PLUGINS_GROUP = "torchcomms.plugins"
BUILTIN = "torchcomms-core"


def _plugin_object(plugin: Any, who: str, kind: str) -> None:
    """A collective plugin is what holds its ``@hookimpl`` functions: a module, a class or
    an instance. An entry point naming one of the functions itself would register no hook
    (pluggy looks for hooks among the object's attributes), so it is refused."""
    if inspect.isfunction(plugin) or inspect.isbuiltin(plugin) or inspect.ismethod(plugin):
        raise BackendLoadError(
            f"{who} is the function {getattr(plugin, '__qualname__', plugin)!r}, which "
            f"registers no hook; the entry point must name the module (or object) that "
            f"holds the @hookimpl functions, e.g. 'name = package.plugin'"
        )


#: The ``torchcomms.plugins`` entry points, in the plugin host's one registry.
COLLECTIVE_PLUGINS: EntryPointRegistry[Any] = EntryPointRegistry(
    group=PLUGINS_GROUP,
    kind="plugin",
    check=_plugin_object,
    known_distributions={"quantized": "torchcomms-quantized"},
    caller="load_plugins",
)


class PluginError(TorchCommError):
    """Plugins conflict (e.g. two register the same collective name)."""


class PluginHookError(PluginError):
    """A plugin's registration hook raised or returned something other than collectives."""


@dataclasses.dataclass
class PluginRecord:
    """What ``torchcomms plugins`` reports about one plugin."""

    name: str
    distribution: str
    version: str
    status: str  # "loaded", "failed", "disabled", "not allowed"
    collectives: list[str] = dataclasses.field(default_factory=list)
    error: str = ""


_lock = threading.RLock()
_manager: pluggy.PluginManager | None = None
_records: dict[str, PluginRecord] = {}
_collectives: dict[str, Collective] = {}
_loaded = False
# A conflict that stopped loading: raised again on every later call, not just the first.
_load_error: PluginError | None = None


def get_plugin_manager() -> pluggy.PluginManager:
    """The process's plugin manager (created with the hookspecs, nothing loaded yet)."""
    global _manager
    with _lock:
        if _manager is None:
            pm = pluggy.PluginManager("torchcomms")
            pm.add_hookspecs(hookspecs)
            _manager = pm
        return _manager


def load_plugins() -> None:
    """Register built-ins and load entry-point plugins, once per process."""
    global _loaded, _load_error
    with _lock:
        if _loaded:
            if _load_error is not None:
                raise PluginError(str(_load_error))
            return
        _loaded = True
        try:
            _load_all()
        except PluginError as exc:
            _load_error = exc
            raise


def _load_all() -> None:
    from torchcomms_core.plugin_host import builtins

    pm = get_plugin_manager()
    _register(pm, builtins, "builtins", BUILTIN, _core_version())
    entries = COLLECTIVE_PLUGINS.entry_points()
    if _env.plugin_autoload_disabled():
        for name, entry in entries.items():
            _records[name] = PluginRecord(name, *_source(entry), "disabled")
    else:
        allowed = _env.plugin_allow_list()
        for name, entry in entries.items():
            dist, version = _source(entry)
            if allowed is not None and name not in allowed:
                _records[name] = PluginRecord(name, dist, version, "not allowed")
                continue
            if pm.has_plugin(name):
                continue
            try:
                plugin = COLLECTIVE_PLUGINS.get(name, stacklevel=4)
            except TorchCommError as exc:  # contained: other plugins and backends keep working
                message = f"torchcomms {exc}; it is skipped"
                _records[name] = PluginRecord(name, dist, version, "failed", error=message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
                continue
            try:
                _register(pm, plugin, name, dist, version)
            except PluginHookError as exc:  # contained like a failed import
                message = (
                    f"torchcomms plugin {name!r} from {dist} {version} failed to "
                    f"register: {exc}. It is skipped; other plugins and backends "
                    f"keep working. Upgrade, fix or uninstall {dist}, or leave it "
                    f"out with {_env.PLUGINS}=<plugins to load>"
                )
                _records[name] = PluginRecord(name, dist, version, "failed", error=message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
    pm.check_pending()


def register_plugin(plugin: Any, name: str | None = None, *, provider: str = "in-process") -> str:
    """Register a plugin object (module or instance with hookimpls) in this process."""
    with _lock:
        load_plugins()
        pm = get_plugin_manager()
        name = name or getattr(plugin, "__name__", None) or repr(plugin)
        _register(pm, plugin, name, provider, "")
        pm.check_pending()
        return name


def unregister_plugin(name: str) -> None:
    """Remove an in-process plugin and the collectives it added."""
    with _lock:
        pm = get_plugin_manager()
        _forget(pm, pm.get_plugin(name), name)


def _register(pm: pluggy.PluginManager, plugin: Any, name: str, dist: str, version: str) -> None:
    """Register ``plugin`` and install its collectives, or leave no trace of it and raise."""
    pm.register(plugin, name=name)
    record = PluginRecord(name, dist, version, "loaded")
    _records[name] = record
    try:
        impl = getattr(plugin, "torchcomms_register_collectives", None)
        if impl is None:
            return
        provider = f"{dist} {version}".strip()
        try:
            colls = list(impl() or [])
        except Exception as exc:
            raise PluginHookError(
                f"its torchcomms_register_collectives hook raised {type(exc).__name__}: {exc}"
            ) from exc
        for coll in colls:
            if not isinstance(coll, Collective):
                raise PluginHookError(
                    f"plugin {name!r} from {provider} returned {coll!r} from "
                    f"torchcomms_register_collectives; return Collective "
                    f"objects"
                )
        for coll in colls:
            _install(dataclasses.replace(coll, provider=provider), name)
            record.collectives.append(coll.name)
    except BaseException:
        _forget(pm, plugin, name)
        raise


def _forget(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    """Undo a partial registration: the plugin, its record and the collectives it added."""
    if plugin is not None and pm.is_registered(plugin):
        pm.unregister(plugin)
    record = _records.pop(name, None)
    for coll in record.collectives if record else []:
        if _collectives.pop(coll, None) is not None and _host is not None:
            _host[1](coll)


def _install(coll: Collective, plugin_name: str) -> None:
    existing = _collectives.get(coll.name)
    if existing is not None:
        raise PluginError(
            f"collective {coll.name!r} is registered twice: by {existing.provider} and by "
            f"{coll.provider}; uninstall one of them or disable one with "
            f"TORCHCOMM_PLUGINS=<names to load>"
        )
    if _host is not None:
        _host[0](coll)  # raises when the name is taken by a built-in method
    _collectives[coll.name] = coll


#: ``(add, remove)`` of the class that turns collectives into methods (``TorchComm``).
_host: tuple[Callable[[Collective], None], Callable[[str], None]] | None = None


def attach_collective_host(
    add: Callable[[Collective], None], remove: Callable[[str], None]
) -> None:
    """Let the communicator class own its plugin methods: ``add`` each collective, now and
    as plugins load, and ``remove`` those of plugins that are unregistered."""
    global _host
    with _lock:
        _host = (add, remove)
        for coll in _collectives.values():
            add(coll)


def list_collectives() -> dict[str, str]:
    """Every collective a ``TorchComm`` offers, mapped to who provides it."""
    load_plugins()
    names = {
        op.name: BUILTIN for op in OPS if op.name not in ("split", "finalize", "batch_op_issue")
    }
    with _lock:
        names.update({n: c.provider for n, c in _collectives.items()})
    return dict(sorted(names.items()))


def plugin_collectives() -> dict[str, Collective]:
    """The collectives plugins (and the core's built-in plugin) add, by name."""
    load_plugins()
    with _lock:
        return dict(_collectives)


def registered_collectives() -> dict[str, Collective]:
    """The plugin collectives registered so far, by name, loading nothing (a snapshot):
    for callers that may run while plugins load, such as ``TorchComm``'s constructor."""
    return dict(_collectives)


def _collective_names() -> list[str]:
    return sorted(plugin_collectives())


set_collective_source(_collective_names)


def plugin_records() -> list[PluginRecord]:
    load_plugins()
    with _lock:
        return list(_records.values())


def failed_plugins() -> list[PluginRecord]:
    with _lock:
        return [r for r in _records.values() if r.status == "failed"]


def call_lifecycle(hook: str, **kwargs: Any) -> None:
    """Run a lifecycle hook; a failing observer warns instead of breaking the communicator."""
    pm = _manager
    if pm is None:
        return
    try:
        getattr(pm.hook, hook)(**kwargs)
    except Exception as exc:
        warnings.warn(
            f"torchcomms plugin hook {hook} raised {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )


def _source(entry: PluginEntry) -> tuple[str, str]:
    """``(distribution, version)`` of a registry entry, as the records show them."""
    return entry.distribution or "an unknown distribution", entry.version or ""


def _core_version() -> str:
    try:
        return metadata.version(BUILTIN)
    except metadata.PackageNotFoundError:
        return ""
