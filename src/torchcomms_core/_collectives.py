"""Collectives added by plugins: their description and how they become methods.

A plugin collective runs the backend's native method of the same name when the
backend has one, else the plugin's portable implementation written against the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._errors import CommTypeError
from ._op_args import args_class

if TYPE_CHECKING:
    from ._comm import TorchComm


@dataclasses.dataclass(frozen=True)
class Collective:
    """A collective contributed by a plugin.

    ``impl(backend, *args, async_op, *, timeout, hints, **kwargs)`` is the portable
    implementation: it receives the ``TorchCommBackend`` and may use any spec method.
    It returns ``None`` when done or an object with ``wait()``.
    ``args`` names the positional arguments before ``async_op``; ``defaults`` gives
    values for trailing ones. ``validate(comm, args, kwargs)`` runs before any
    communication and returns the (possibly converted) ``(args, kwargs)``.
    """

    name: str
    impl: Callable[..., Any]
    args: tuple[str, ...]
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    validate: (
        Callable[
            [TorchComm, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]
        ]
        | None
    ) = None
    doc: str = ""
    #: Filled in by the plugin manager: who provides it.
    provider: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise CommTypeError(
                f"Collective name {self.name!r} must be a public Python "
                f"identifier (it becomes a method of TorchComm)"
            )
        if not callable(self.impl):
            raise CommTypeError(f"Collective {self.name!r}: impl must be callable")


def make_method(coll: Collective) -> Callable[..., Any]:
    """The ``TorchComm`` method that dispatches ``coll`` (no pluggy on this path)."""
    name, nargs, impl, validate = coll.name, len(coll.args), coll.impl, coll.validate
    fill = [coll.defaults[a] for a in coll.args if a in coll.defaults]
    first_default = nargs - len(fill)
    args_class(name, coll.args)

    def method(
        self: TorchComm,
        *args: Any,
        async_op: Any = None,
        hints: dict[str, str] | None = None,
        timeout: Any = None,
        **kwargs: Any,
    ) -> Any:
        call = self._call(name, timeout, hints)
        given = len(args)
        if given > nargs:
            if given == nargs + 1 and async_op is None:
                async_op, args = args[-1], args[:-1]
            else:
                raise CommTypeError(
                    f"{name}() takes {nargs} positional arguments "
                    f"({', '.join(coll.args)}) and async_op; got {given}"
                )
        elif given < nargs:
            if given < first_default:
                missing = ", ".join(coll.args[given:first_default])
                raise CommTypeError(f"{name}() is missing required arguments: {missing}")
            args = args + tuple(fill[given - first_default :])
        if validate is not None:
            args, kwargs = validate(self, args, kwargs)
        native = getattr(self._backend, name, None)
        if native is not None:
            return self._issue(call, args, bool(async_op), args, native, extra=kwargs)
        return self._issue(call, (self._backend, *args), bool(async_op), args, impl, extra=kwargs)

    method.__name__ = name
    method.__qualname__ = f"TorchComm.{name}"
    method.__doc__ = coll.doc or f"{name}: a collective provided by {coll.provider}."
    method._plugin_collective = True  # type: ignore[attr-defined]
    return method
