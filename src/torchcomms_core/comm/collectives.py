"""Plugin collectives as ``TorchComm`` methods: the method that dispatches a :class:`Collective`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchcomms_core.foundation.errors import CommTypeError
from torchcomms_core.operations.args import args_class
from torchcomms_core.plugin_host.collective import Collective

if TYPE_CHECKING:
    from torchcomms_core.comm.base import CommBase


def make_method(coll: Collective) -> Callable[..., Any]:
    """The ``TorchComm`` method that dispatches ``coll`` (no pluggy on this path)."""
    name, nargs, impl, validate = coll.name, len(coll.args), coll.impl, coll.validate
    fill = [coll.defaults[a] for a in coll.args if a in coll.defaults]
    first_default = nargs - len(fill)
    args_class(name, coll.args)

    def method(
        self: CommBase,
        *args: Any,
        async_op: Any = None,
        hints: dict[str, str] | None = None,
        timeout: Any = None,
        **kwargs: Any,
    ) -> Any:
        call = self._guard(name, timeout, hints)
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
        backend = self.get_backend_impl()
        native = getattr(backend, name, None)
        if native is not None:
            return self._issue(call, args, bool(async_op), args, native, extra=kwargs)
        return self._issue(call, (backend, *args), bool(async_op), args, impl, extra=kwargs)

    method.__name__ = name
    method.__qualname__ = f"TorchComm.{name}"
    method.__doc__ = coll.doc or f"{name}: a collective provided by {coll.provider}."
    method._plugin_collective = True  # type: ignore[attr-defined]
    return method
