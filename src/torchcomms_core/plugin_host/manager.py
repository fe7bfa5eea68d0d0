"""The plugin manager: built-ins first, then ``torchcomms.plugins`` entry points.

``TORCHCOMM_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points; ``TORCHCOMM_PLUGINS=a,b``
loads only the named ones. Collectives are collected once and installed on
``TorchComm``; no operation goes through pluggy.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import threading
import warnings
from collections.abc import Callable
from typing import Any

import pluggy

from torchcomms_core.foundation import env as _env
from torchcomms_core.foundation.errors import TorchCommError
from torchcomms_core.operations.table import OPS
from torchcomms_core.plugin_host import hookspecs
from torchcomms_core.plugin_host.collective import Collective
from torchcomms_core.spec import set_collective_source

PLUGINS_GROUP = "torchcomms.plugins"
BUILTIN = "torchcomms-core"


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
    if _env.plugin_autoload_disabled():
        for ep in metadata.entry_points(group=PLUGINS_GROUP):
            dist, version = _dist_of(ep)
            _records[ep.name] = PluginRecord(ep.name, dist, version, "disabled")
    else:
        allowed = _env.plugin_allow_list()
        for ep in metadata.entry_points(group=PLUGINS_GROUP):
            dist, version = _dist_of(ep)
            if allowed is not None and ep.name not in allowed:
                _records[ep.name] = PluginRecord(ep.name, dist, version, "not allowed")
                continue
            if pm.has_plugin(ep.name):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # contained: other plugins and backends keep working
                message = (
                    f"torchcomms plugin {ep.name!r} from {dist} {version} failed to "
                    f"import ({type(exc).__name__}: {exc}); it is skipped. Reinstall "
                    f"or uninstall {dist}"
                )
                _records[ep.name] = PluginRecord(ep.name, dist, version, "failed", error=message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
                continue
            try:
                _register(pm, plugin, ep.name, dist, version)
            except PluginHookError as exc:  # contained like a failed import
                message = (
                    f"torchcomms plugin {ep.name!r} from {dist} {version} failed to "
                    f"register: {exc}. It is skipped; other plugins and backends "
                    f"keep working. Upgrade, fix or uninstall {dist}, or leave it "
                    f"out with {_env.PLUGINS}=<plugins to load>"
                )
                _records[ep.name] = PluginRecord(ep.name, dist, version, "failed", error=message)
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


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "an unknown distribution", ""
    return dist.metadata["Name"], dist.version


def _core_version() -> str:
    try:
        return metadata.version(BUILTIN)
    except metadata.PackageNotFoundError:
        return ""
