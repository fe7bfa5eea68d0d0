"""Call each backend the way it was written: with or without ``timeout``/``hints``.

The spec passes ``timeout=`` and ``hints=`` to every operation. A Python backend written
the reference's way declares collectives without them (``def all_reduce(self, tensor, op,
async_op)``). Which keywords each method takes is read once per class from its
signature; methods that lack some get a thin adapter on the instance, so the per-call
path of a spec-style backend is untouched.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from typing import Any

from torchcomms_core.operations.table import names

#: Backend methods the core (and the spec's portable defaults) call with the keywords.
OPERATIONS: tuple[str, ...] = names(issued=True)
_KEYWORDS = frozenset({"timeout", "hints"})

_lock = threading.Lock()
_plans: dict[type, dict[str, frozenset[str]]] = {}


def keyword_plan(cls: type) -> dict[str, frozenset[str]]:
    """Methods of ``cls`` that do not take both keywords -> the keywords they do take."""
    with _lock:
        plan = _plans.get(cls)
    if plan is not None:
        return plan
    plan = {}
    for name in OPERATIONS:
        fn = getattr(cls, name, None)
        if fn is None:
            continue
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin: assume the spec's calling convention
            continue
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            continue
        taken = frozenset(k for k in _KEYWORDS if k in params)
        if taken != _KEYWORDS:
            plan[name] = taken
    with _lock:
        _plans[cls] = plan
    return plan


def _adapter(fn: Callable[..., Any], taken: frozenset[str]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, timeout: Any = None, hints: Any = None) -> Any:
        if not taken:
            return fn(*args)
        passed = {}
        if "timeout" in taken:
            passed["timeout"] = timeout
        if "hints" in taken:
            passed["hints"] = hints
        return fn(*args, **passed)

    return call


def adapt_backend(backend: Any) -> None:
    """Install adapters on ``backend`` for its methods that lack the keywords."""
    for name, taken in keyword_plan(type(backend)).items():
        if getattr(getattr(backend, name, None), "__torchcomms_adapted__", False):
            continue
        adapted = _adapter(getattr(backend, name), taken)
        adapted.__torchcomms_adapted__ = True  # type: ignore[attr-defined]
        setattr(backend, name, adapted)
