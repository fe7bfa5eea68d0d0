"""What async collectives return on the compile path.

Eagerly, a result that carries a gradient is a :class:`TorchCommsAsyncTensor`, which waits
for its collective the first time it is used. While tracing, every async call returns a
:class:`FakeWork` whose ``wait()`` puts the wait op into the graph where the user waits,
so the collective overlaps whatever the graph computes in between.
"""

from __future__ import annotations

from typing import Any

import torch

from .ops import op


class TorchCommsAsyncTensor(torch.Tensor):
    """The result of an async collective that waits for it on first use.

    It shares storage and autograd history with the collective's output; any torch
    operation on it (or :meth:`wait`) first waits for the collective. Results of those
    operations are plain tensors.
    """

    _torchcomms_work: Any

    @staticmethod
    def wrap(result: torch.Tensor, work: Any) -> TorchCommsAsyncTensor:
        out = result.as_subclass(TorchCommsAsyncTensor)
        out._torchcomms_work = work
        return out

    def wait(self) -> torch.Tensor:
        """Wait for the collective now; returns this tensor."""
        _settle(self)
        return self

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        for value in (*args, *kwargs.values()):
            if isinstance(value, TorchCommsAsyncTensor):
                _settle(value)
            elif isinstance(value, (list, tuple)):
                for item in value:
                    if isinstance(item, TorchCommsAsyncTensor):
                        _settle(item)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def _settle(t: TorchCommsAsyncTensor) -> None:
    work = t.__dict__.get("_torchcomms_work")
    if work is not None:
        t._torchcomms_work = None
        work.wait()


class FakeWork:
    """Stands in for ``TorchWork`` while tracing: ``wait()`` emits the wait op.

    ``tensors`` are the tensors the collective writes in place; ``results`` are new result
    tensors (the differentiable form), which ``wait()`` returns once ready.
    """

    def __init__(
        self,
        tensors: list[torch.Tensor],
        results: list[torch.Tensor] | None = None,
        single: bool = True,
    ) -> None:
        self._tensors = tensors
        self._results = results
        self._single = single
        self._done = False

    def wait(self) -> Any:
        """Wait for the collective at this point of the graph.

        Returns ``None`` for in-place collectives; the result tensor (or list) for the
        differentiable form.
        """
        if self._results is not None:
            if not self._done:
                self._results = op("torchcomm_wait_tensors")(self._results)
                self._done = True
            return self._results[0] if self._single else list(self._results)
        if not self._done:
            op("torchcomm_wait_tensors_")(self._tensors)
            self._done = True
        return None

    def is_completed(self) -> bool:
        return self._done
