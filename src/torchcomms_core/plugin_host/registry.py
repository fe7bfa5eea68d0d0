"""One registry of plugin classes found by name: in-process registrations, then entry points.

:class:`EntryPointRegistry` serves every group the core loads classes from by name:
``torchcomms.backends`` (:mod:`.backends`), ``torchcomms.transports`` (:mod:`.transports`)
and ``torchcomms.tuners`` (:mod:`.tuners`). It reads installed entry points lazily
(distribution metadata only; a plugin is imported when its name is first asked for),
settles names that several distributions register, validates the loaded class once (a
:class:`ClassCheck`: its base and declared spec version), lists every name with where it
comes from and whether it loads (:meth:`EntryPointRegistry.describe`, what the command
line prints), and raises one family of errors: a not-found error
(``BackendNotFoundError`` or its subclass) and
:class:`~torchcomms_core.foundation.errors.BackendLoadError`.

Imports ``foundation`` only.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata as metadata
import re
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

from torchcomms_core.foundation.errors import (
    BackendLoadError,
    BackendNotFoundError,
    CommTypeError,
)
from torchcomms_core.foundation.spec_version import check_spec_version

__all__ = [
    "IN_PROCESS",
    "ClassCheck",
    "EntryPointRegistry",
    "PluginEntry",
    "check_spec_version",
    "runs_here",
]

P = TypeVar("P")


@dataclasses.dataclass(frozen=True)
class PluginEntry:
    """Where a plugin class comes from: an entry point or an in-process registration.

    ``others`` lists further distributions that register the same name; ``choice`` says
    why this one is used: ``"only"``, ``"built-in"``, ``"override"`` or ``"ambiguous"``
    (several candidates and no rule to pick one: :meth:`EntryPointRegistry.get` refuses it).
    """

    name: str
    value: str
    distribution: str | None
    version: str | None
    entry_point: Any = None
    others: tuple[PluginEntry, ...] = ()
    choice: str = "only"

    @property
    def provider(self) -> str:
        """``"distribution version"``, as messages and the command line show it."""
        return f"{self.distribution or 'an unknown distribution'} {self.version or ''}".strip()


def normalized(dist: str | None) -> str:
    """A distribution name as packaging compares them (``Foo_Bar`` is ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", dist or "").lower()


#: What :meth:`EntryPointRegistry.describe` gives as the distribution of a name registered
#: in-process (no entry point), with an empty version.
IN_PROCESS = "(registered in-process)"


def runs_here(cls: Any) -> tuple[bool, str]:
    """A plugin class's ``is_available()``, with an exception it raises reported as the reason."""
    try:
        ok, reason = cls.is_available()
    except Exception as exc:
        return False, f"is_available() raised {exc!r}"
    return bool(ok), str(reason)


@dataclasses.dataclass(frozen=True)
class ClassCheck:
    """The validation of a plugin class, loaded or registered: a subclass of ``base`` that
    declares a spec version this core's ``spec_version`` runs, and in which ``problems``
    finds nothing (each problem is one string; ``docs`` says where the spec's required
    methods are described). Messages name ``base`` as ``base_name``, by default its module
    and name."""

    base: type[Any]
    spec_version: str
    base_name: str = ""
    problems: Callable[[type[Any]], list[str]] | None = None
    docs: str = ""

    def __call__(self, cls: Any, who: str, kind: str) -> None:
        """Raise :class:`BackendLoadError` unless ``cls`` passes; ``who`` and ``kind`` (the
        plugin kind, ``"backend"``) name it in the message."""
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            base_name = self.base_name or f"{self.base.__module__}.{self.base.__qualname__}"
            raise BackendLoadError(
                f"{who} is {cls!r}, not a subclass of {base_name}; the entry point must "
                f"name the {kind} class"
            )
        check_spec_version(getattr(cls, "spec_version", "0.0"), self.spec_version, who, kind)
        problems = self.problems(cls) if self.problems is not None else []
        if problems:
            raise BackendLoadError(
                f"{who}: class {cls.__module__}.{cls.__qualname__} does not meet the "
                f"{kind} spec: " + "; ".join(problems) + f". See {self.docs}"
            )


@dataclasses.dataclass(eq=False, kw_only=True)
class EntryPointRegistry(Generic[P]):
    """The plugin classes of one entry-point group, by name.

    Fields (keywords only):
        group: the entry-point group (``"torchcomms.backends"``).
        kind: what a plugin of the group is called in messages (``"backend"``).
        check: the validation of every class registered or loaded (a :class:`ClassCheck`,
            or any callable ``(cls, who, kind)`` that raises :class:`BackendLoadError`).
        known_distributions: the distribution that provides each built-in name; it wins
            when several distributions register that name.
        override_var: the environment variable that picks a distribution for a name
            (``read_overrides`` reads it as ``{name: distribution}``), or ``None``.
        alternative: the end of a not-found message after the install hint: another way
            to get ``name``, formatted with ``name``.
        not_found: the error a missing name raises (a :class:`BackendNotFoundError`).
        caller: the user call an ambiguous name is refused in (``"new_comm"``).
    """

    group: str
    kind: str
    check: Callable[[Any, str, str], None]
    known_distributions: dict[str, str]
    override_var: str | None = None
    read_overrides: Callable[[], dict[str, str]] | None = None
    alternative: str = ""
    not_found: type[BackendNotFoundError] = BackendNotFoundError
    caller: str = ""
    _lock: threading.Lock = dataclasses.field(
        default_factory=threading.Lock, init=False, repr=False
    )
    _registered: dict[str, type[P]] = dataclasses.field(
        default_factory=dict, init=False, repr=False
    )
    _loaded: dict[str, type[P]] = dataclasses.field(default_factory=dict, init=False, repr=False)

    # -- in-process registrations -------------------------------------------------------

    def register(self, name: str, cls: type[P], *, override: bool = False) -> None:
        """Register ``cls`` under ``name`` for this process; a different class already
        registered under that name is replaced only with ``override``."""
        where = f"register_{self.kind}"
        if not isinstance(name, str) or not name:
            raise CommTypeError(f"{where}: name must be a non-empty string, got {name!r}")
        self.check_class(cls, f"{self.kind} class {cls!r} registered as {name!r}")
        with self._lock:
            existing = self._registered.get(name)
            if existing is not None and existing is not cls and not override:
                raise ValueError(
                    f"{where}: {name!r} is already registered to {existing.__qualname__}; "
                    f"call unregister_{self.kind}({name!r}) first or pass override=True"
                )
            self._registered[name] = cls

    def unregister(self, name: str) -> type[P] | None:
        """Remove an in-process registration (entry points are unaffected); return its class."""
        with self._lock:
            return self._registered.pop(name, None)

    def is_known(self, name: str) -> bool:
        """Whether ``name`` is registered in-process or its plugin is already loaded."""
        with self._lock:
            return name in self._registered or name in self._loaded

    # -- entry points -------------------------------------------------------------------

    def overrides(self) -> dict[str, str]:
        """``{name: distribution}`` from ``override_var`` (empty without one)."""
        if self.read_overrides is None:
            return {}
        try:
            return self.read_overrides()
        except ValueError as exc:
            raise BackendLoadError(str(exc)) from None

    def entry_points(self) -> dict[str, PluginEntry]:
        """Installed plugins by name, read from distribution metadata (nothing is imported).

        When several distributions register one name, a built-in name keeps its own
        distribution (``known_distributions``) unless ``override_var`` names another; the
        rest are listed in ``others``.
        """
        candidates: dict[str, list[PluginEntry]] = {}
        for ep in metadata.entry_points(group=self.group):
            dist = getattr(ep, "dist", None)
            entry = PluginEntry(
                name=ep.name,
                value=ep.value,
                distribution=dist.metadata["Name"] if dist is not None else None,
                version=dist.version if dist is not None else None,
                entry_point=ep,
            )
            same = candidates.setdefault(ep.name, [])
            # One distribution seen twice (e.g. on two path entries) is not a conflict.
            if not any(
                normalized(e.distribution) == normalized(entry.distribution)
                and e.value == entry.value
                for e in same
            ):
                same.append(entry)
        overrides = self.overrides()
        return {
            name: self._choose(name, found, overrides.get(name))
            for name, found in candidates.items()
        }

    def _choose(self, name: str, found: list[PluginEntry], override: str | None) -> PluginEntry:
        def pick(entry: PluginEntry, choice: str) -> PluginEntry:
            others = tuple(e for e in found if e is not entry)
            return dataclasses.replace(entry, others=others, choice=choice)

        if override is not None:
            for entry in found:
                if normalized(entry.distribution) == normalized(override):
                    return pick(entry, "override")
            return pick(found[0], "ambiguous")  # the override names nothing installed
        if len(found) == 1:
            return found[0]
        own = self.known_distributions.get(name)
        for entry in found:
            if own is not None and normalized(entry.distribution) == normalized(own):
                return pick(entry, "built-in")
        return pick(found[0], "ambiguous")

    def conflict_message(self, entry: PluginEntry) -> str:
        """What to tell the user about a name several distributions register (or an override)."""
        name, kind, var = entry.name, self.kind, self.override_var
        everyone = [entry, *entry.others]
        listing = " and ".join(e.provider for e in everyone)
        override = self.overrides().get(name)
        if entry.choice == "ambiguous" and override is not None:
            return (
                f"{var} asks for {kind} {name!r} from {override!r}, but it is provided only by "
                f"{listing}; set {var}={name}=<one of those distributions> or install {override}"
            )
        if entry.choice == "ambiguous":
            choose = (
                f"choose one with {var}={name}={everyone[0].distribution} (for example), or "
                if var
                else ""
            )
            return (
                f"{kind} {name!r} is registered by {listing}, and none of them is its built-in "
                f"provider; {choose}uninstall the others"
            )
        ignored = ", ".join(e.provider for e in entry.others)
        why = "its built-in provider" if entry.choice == "built-in" else f"chosen by {var}"
        if entry.choice != "built-in":
            hint = ""
        elif var:
            hint = f"; to use another one set {var}={name}=<distribution>, or uninstall {ignored}"
        else:
            hint = f"; to use another one uninstall {ignored}"
        return (
            f"{kind} {name!r} is registered by {listing}; using {entry.provider} ({why}) and "
            f"ignoring {ignored}{hint}"
        )

    # -- lookup -------------------------------------------------------------------------

    def in_process_names(self) -> list[str]:
        """The names registered in this process (no entry point is read)."""
        with self._lock:
            return sorted(self._registered)

    def names(self) -> list[str]:
        """Every name: registered in-process or installed as a plugin."""
        with self._lock:
            names = set(self._registered)
        names.update(self.entry_points())
        return sorted(names)

    def get(self, name: str, *, stacklevel: int = 3) -> type[P]:
        """The class registered or installed as ``name``, importing only its plugin.

        Raises:
            BackendNotFoundError (``not_found``): nothing has that name.
            BackendLoadError: the plugin is ambiguous, fails to import or to pass the checks.
        """
        import warnings

        with self._lock:
            cls = self._registered.get(name) or self._loaded.get(name)
        if cls is not None:
            return cls
        entry = self.entry_points().get(name)
        if entry is None:
            raise self.not_found(self.not_found_message(name))
        if entry.choice == "ambiguous":
            raise BackendLoadError(f"{self.caller or self.kind}: {self.conflict_message(entry)}")
        if entry.choice == "built-in":
            warnings.warn(
                f"torchcomms: {self.conflict_message(entry)}", RuntimeWarning, stacklevel=stacklevel
            )
        who = f"{self.kind} {name!r} from {entry.provider}"
        try:
            loaded = entry.entry_point.load()
        except Exception as exc:
            raise BackendLoadError(self._import_failure(entry, who, exc)) from exc
        self.check_class(loaded, who)  # raises unless it is a subclass of ``base``
        with self._lock:
            self._loaded[name] = loaded
        return cast(type[P], loaded)

    def check_class(self, cls: Any, who: str) -> None:
        """Raise :class:`BackendLoadError` unless ``cls`` passes ``check``."""
        self.check(cls, who, self.kind)

    # -- listing ------------------------------------------------------------------------

    def describe(
        self,
        loaded: Callable[[type[P]], dict[str, Any]],
        failed: Callable[[Exception], dict[str, Any]],
        *,
        about: Callable[[str, PluginEntry | None], dict[str, Any]] | None = None,
        in_process: Callable[[str], tuple[str, str]] | None = None,
    ) -> list[dict[str, Any]]:
        """One record per name (:meth:`names`), each plugin imported to ask it.

        A record starts with where the name comes from: ``name``, ``distribution``,
        ``version`` and ``entry_point`` (for a name registered in-process: ``in_process``'s
        ``(distribution, version)`` of the name, by default ``(IN_PROCESS, "")``, and no
        entry point); then come what ``about`` adds for the name and its entry, and what
        ``loaded`` says of the class, or ``failed`` of the exception that kept it from
        loading or describing: other names are listed all the same.
        """
        entries = self.entry_points()
        rows = []
        for name in self.names():
            entry = entries.get(name)
            if entry is not None:
                source = (entry.distribution, entry.version or "")
            else:
                source = in_process(name) if in_process is not None else (IN_PROCESS, "")
            row: dict[str, Any] = {
                "name": name,
                "distribution": source[0],
                "version": source[1],
                "entry_point": entry.value if entry else "",
            }
            if about is not None:
                row.update(about(name, entry))
            try:
                row.update(loaded(self.get(name)))
            except Exception as exc:  # report it; the other plugins keep working
                row.update(failed(exc))
            rows.append(row)
        return rows

    def not_found_message(self, name: str) -> str:
        """Why ``name`` is not found, what is installed, and what to install."""
        installed = self.names()
        listing = ", ".join(repr(n) for n in installed) if installed else "none"
        dist = self.known_distributions.get(name)
        if dist is not None:
            hint = f"install it with `pip install {dist}`"
        else:
            hint = (
                f"install the distribution that provides it (it must register {name!r} in the "
                f"{self.group!r} entry-point group)"
            )
        also = self.alternative.format(name=name)
        return (
            f"failed to find {self.kind} {name!r}: no torchcomms {self.kind} named {name!r} is "
            f"installed (installed: {listing}); {hint}{also}"
        )

    def _import_failure(self, entry: PluginEntry, who: str, exc: Exception) -> str:
        """Why the entry point of ``entry`` did not load, and what fixes it."""
        module, _, attr = entry.value.partition(":")
        module = module.strip()
        section = f'[project.entry-points."{self.group}"]'
        fix_entry = (
            f"fix the entry point {entry.name} = {entry.value!r} in the {section} section of "
            f"{entry.distribution or 'its distribution'}'s pyproject.toml, then reinstall it "
            f"(pip install -e . while developing)"
        )
        if isinstance(exc, ModuleNotFoundError) and exc.name and module.startswith(exc.name):
            return (
                f"{who}: its entry point {entry.value!r} names module {module!r}, which does "
                f"not exist ({exc}); {fix_entry}"
            )
        if isinstance(exc, AttributeError) and attr:
            return (
                f"{who}: its entry point {entry.value!r} names {attr.strip()!r}, which module "
                f"{module!r} does not define ({exc}); {fix_entry}"
            )
        return (
            f"{who} failed to import ({type(exc).__name__}: {exc}); the error is raised by "
            f"the plugin's own code (see the traceback), or a dependency of it is missing. Fix "
            f"or reinstall {entry.distribution or entry.name}, or uninstall it; other "
            f"{self.kind}s keep working"
        )
