"""Small handles the communicator returns: hook registrations, persistent all-gathers."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchcomms_core.foundation.errors import CommTypeError

if TYPE_CHECKING:
    import torch


class RemovableHandle:
    """Returned by ``register_*_hook``; ``remove()`` unregisters the hook."""

    __slots__ = ("_table", "_key", "_changed")
    _ids = itertools.count()

    def __init__(
        self,
        table: dict[int, Callable[..., Any]],
        fn: Any,
        where: str,
        changed: Callable[[], None] | None = None,
    ) -> None:
        if not callable(fn):
            raise CommTypeError(f"{where}: expected a callable, got {type(fn).__name__}")
        self._table = table
        self._key = next(self._ids)
        self._changed = changed  # told after the table changed
        table[self._key] = fn
        if changed is not None:
            changed()

    def remove(self) -> None:
        """Unregister the hook; calling it again does nothing.

        Leaving a ``with handle:`` block calls it too.
        """
        self._table.pop(self._key, None)
        if self._changed is not None:
            self._changed()

    def __enter__(self) -> RemovableHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class PersistentAllGather:
    """Handle of a persistent all-gather: the bound output tensor."""

    __slots__ = ("comm", "output")

    def __init__(self, comm: object, output: torch.Tensor) -> None:
        self.comm = comm
        self.output: torch.Tensor | None = output


def owned(handle: Any, comm: object, where: str) -> PersistentAllGather:
    """``handle`` after checking it is a persistent all-gather of ``comm``."""
    if not isinstance(handle, PersistentAllGather) or handle.comm is not comm:
        raise CommTypeError(f"{where}: handle must come from this communicator's all_gather_p_init")
    return handle
