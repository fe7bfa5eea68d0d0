"""Collectives added by plugins: their description and how they become methods.

A plugin collective runs the backend's native method of the same name when the
backend has one, else the plugin's portable implementation written against the spec.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torchcomms_core.foundation.errors import CommTypeError


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

    #: The ``TorchComm`` method the collective becomes (a public identifier).
    name: str
    #: The portable implementation, run when the backend has no method named ``name``.
    impl: Callable[..., Any]
    #: The names of the positional arguments before ``async_op``, in order.
    args: tuple[str, ...]
    #: Values of trailing ``args`` a caller may leave out, by name.
    defaults: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: A check run on every call as ``validate(comm, args, kwargs) -> (args, kwargs)``,
    #: after the communicator's state, ``timeout`` and ``hints`` are checked and before
    #: hooks or any communication, with ``args`` completed from ``defaults``; it raises the
    #: user's error and may convert arguments. ``None`` (the default) checks nothing beyond
    #: the core's checks.
    validate: (
        Callable[[Any, tuple[Any, ...], dict[str, Any]], tuple[tuple[Any, ...], dict[str, Any]]]
        | None
    ) = None
    #: The docstring of the ``TorchComm`` method the collective becomes; left empty, the
    #: method gets a line naming the provider.
    doc: str = ""
    #: How ``torchcomms bench`` measures the collective: a ``BenchOp`` (see
    #: ``torchcomms_core.plugin.bench``: the inputs, the exact expected result, the bytes
    #: that cross the bus); or, so that the benchmark's code is imported only when a
    #: benchmark runs, ``"module:Name"`` naming its class (or an instance, or a function
    #: returning one), or a function without arguments returning one. Its ``name`` is
    #: the collective's. ``None`` (the default): not benchmarkable.
    bench: Any = None
    #: Who provides the collective, filled in by the plugin manager.
    provider: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name.startswith("_"):
            raise CommTypeError(
                f"Collective name {self.name!r} must be a public Python "
                f"identifier (it becomes a method of TorchComm)"
            )
        if not callable(self.impl):
            raise CommTypeError(f"Collective {self.name!r}: impl must be callable")
        bench = self.bench
        if bench is not None and not (
            callable(bench) or hasattr(bench, "run") or (isinstance(bench, str) and ":" in bench)
        ):
            raise CommTypeError(
                f"Collective {self.name!r}: bench must be a BenchOp, 'module:Name' or a "
                f"function returning a BenchOp, got {bench!r}"
            )
