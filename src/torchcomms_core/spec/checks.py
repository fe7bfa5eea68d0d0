"""Checks of a backend class against the contract: what it implements, and whether it fits.

:func:`method_support` reports each operation as native, derived, unsupported or missing;
:func:`backend_class_problems` and :func:`check_spec_version` say why a class cannot be
loaded; :func:`method_signature` shows how the core calls a spec method.

Imports: ``torchcomms_core.foundation`` (errors, at call time), ``spec.backend``,
``spec.defaults`` and ``spec.tuning``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Literal, overload

from torchcomms_core.foundation.spec_version import check_spec_version as _check_version
from torchcomms_core.spec.backend import (
    DERIVABLE_METHODS,
    OPTIONAL_METHODS,
    REQUIRED_METHODS,
    SPEC_VERSION,
    TorchCommBackend,
)
from torchcomms_core.spec.defaults import FORWARDING_DEFAULTS
from torchcomms_core.spec.tuning import OpAlgorithms


@overload
def method_support(
    backend: type[TorchCommBackend] | TorchCommBackend, *, algorithms: Literal[False] = False
) -> dict[str, str]: ...


@overload
def method_support(
    backend: type[TorchCommBackend] | TorchCommBackend, *, algorithms: Literal[True]
) -> dict[str, Any]: ...


def method_support(
    backend: type[TorchCommBackend] | TorchCommBackend, *, algorithms: bool = False
) -> dict[str, Any]:
    """Map each operation to ``"native"``, ``"derived"``, ``"unsupported"`` or ``"missing"``.

    With ``algorithms=True`` an operation the backend declares algorithms for maps to
    ``{"support": ..., "algorithms": [{"name", "params", "doc"}, ...], "default": ...,
    "forced_by": [...]}`` instead (``TorchCommBackend.algorithms``, #45).

    An operation whose default only forwards to its uneven form with the same arguments
    (``spec.defaults.FORWARDING_DEFAULTS``, from the table's ``uneven_of``) is ``"native"``
    when that other one is.

    ``"missing"``: a required method the class does not implement (such a class cannot be
    loaded; :func:`backend_class_problems` says why). The collectives that plugins add
    (``torchcomms.list_collectives()``) are listed too: ``"native"`` when the backend has a
    method of that name, else ``"derived"`` (the plugin's portable implementation).
    """
    cls = backend if isinstance(backend, type) else type(backend)
    report: dict[str, str] = {}
    missing = _abstract(cls)
    for name in REQUIRED_METHODS:
        report[name] = "missing" if name in missing else "native"
    for name in DERIVABLE_METHODS:
        report[name] = "native" if _overrides(cls, name) else "derived"
    for name, target in FORWARDING_DEFAULTS.items():
        if report.get(target) == "native":
            report[name] = "native"  # the default forwards, unchanged, to a native method
    for name in OPTIONAL_METHODS:
        report[name] = "native" if _overrides(cls, name) else "unsupported"
    if report["reconfigure_engine"] == "native" and not cls.reconfigure_support()[0]:
        report["reconfigure_engine"] = "unsupported"  # implemented, but not on this build
    for name in _collective_names():
        report.setdefault(name, "native" if callable(getattr(cls, name, None)) else "derived")
    if not algorithms:
        return report
    full: dict[str, Any] = dict(report)
    for name, spec in getattr(cls, "algorithms", {}).items():
        if isinstance(spec, OpAlgorithms):
            full[name] = {"support": report.get(name, "native"), **spec.describe()}
    return full


#: Names of the collectives plugins add (set by the plugin manager, which sits above the
#: spec: see ``set_collective_source``).
_collective_source: Callable[[], Sequence[str]] | None = None


def set_collective_source(source: Callable[[], Sequence[str]]) -> None:
    """Let :func:`method_support` list plugin collectives: ``source()`` names them."""
    global _collective_source
    _collective_source = source


def _collective_names() -> Sequence[str]:
    from torchcomms_core.foundation.errors import TorchCommError

    if _collective_source is None:
        return ()
    try:
        return _collective_source()
    except TorchCommError:  # a broken plugin set: reported where plugins are loaded
        return ()


def _abstract(cls: type) -> frozenset[str]:
    return frozenset(
        name
        for name in REQUIRED_METHODS
        if getattr(getattr(cls, name, None), "__isabstractmethod__", False)
        or not callable(getattr(cls, name, None))
    )


def method_signature(name: str) -> str:
    """How the core calls the spec method ``name``: ``"send(self, tensor, dst, ...)"``."""
    # Annotations are strings here (postponed evaluation): show them without quotes.
    return f"{name}{inspect.signature(getattr(TorchCommBackend, name))}".replace("'", "")


def backend_class_problems(cls: type[TorchCommBackend]) -> list[str]:
    """What keeps ``cls`` from working as a backend: each required method it lacks, and
    each spec method it defines with a signature the core cannot call. Empty when fine."""
    problems = []
    missing = _abstract(cls)
    if missing:
        names = ", ".join(n for n in REQUIRED_METHODS if n in missing)
        problems.append(
            f"missing required method(s) {names}: implement "
            + "; ".join(method_signature(n) for n in REQUIRED_METHODS if n in missing)
        )
    for name in (*REQUIRED_METHODS, *DERIVABLE_METHODS, *OPTIONAL_METHODS):
        if name in missing or not _overrides(cls, name):
            continue
        problem = _signature_problem(cls, name)
        if problem:
            problems.append(problem)
    declared = getattr(cls, "algorithms", {})
    if not hasattr(declared, "items"):
        problems.append(f"algorithms must map operation names to OpAlgorithms, got {declared!r}")
        return problems
    for op, spec in declared.items():
        if not isinstance(spec, OpAlgorithms):
            problems.append(
                f"algorithms[{op!r}] is {spec!r}; declare OpAlgorithms((Algorithm(...), ...), "
                f"default=...)"
            )
    return problems


def _signature_problem(cls: type, name: str) -> str | None:
    spec = inspect.signature(getattr(TorchCommBackend, name))
    params = list(spec.parameters.values())[1:]  # without self
    positional = [p for p in params if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = [p for p in positional if p.default is p.empty]
    # ``timeout`` and ``hints`` may be left out: the core then calls without them (a
    # reference-style backend, see ``_calling``).
    keywords = {
        p.name: None
        for p in params
        if p.kind is p.KEYWORD_ONLY and p.name not in ("timeout", "hints")
    }
    static = inspect.getattr_static(cls, name)
    try:
        sig = inspect.signature(getattr(cls, name))
    except (TypeError, ValueError):  # not introspectable (a C function): trust it
        return None
    lead = () if isinstance(static, (staticmethod, classmethod)) else (None,)
    try:
        sig.bind(*lead, *[None] * len(positional), **keywords)
        sig.bind(*lead, *[None] * len(required))
    except TypeError as exc:
        return (
            f"{name}{sig} cannot be called as the core calls it ({exc}); the spec's "
            f"signature is {method_signature(name)}"
        )
    return None


def _overrides(cls: type, name: str) -> bool:
    return getattr(cls, name, None) is not getattr(TorchCommBackend, name)


def check_spec_version(declared: str, who: str) -> None:
    """Raise :class:`BackendLoadError` unless a backend's declared spec version runs on this
    core: the same major as :data:`SPEC_VERSION` and a minor no newer."""
    _check_version(declared, SPEC_VERSION, who, "backend")
