"""What async collectives return on the compile path.

Eagerly, a result that carries a gradient is a :class:`TorchCommsAsyncTensor`, which waits
for its collective the first time it is used. While tracing, every async call returns a
:class:`FakeWork` whose ``wait()`` puts the wait op into the graph where the user waits,
so the collective overlaps whatever the graph computes in between.
"""

from __future__ import annotations

from typing import Any

import torch

from torchcomms_core.functional.ops import op


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
        # Completion steps may write the result in place; that is not a differentiable use.
        with torch.no_grad():
            work.wait()


class FakeWork:
    """Stands in for ``TorchWork`` while tracing: ``wait()`` puts the wait op in the graph.

    ``results`` are the functional op's outputs (in flight until the wait); ``reads`` are
    tensors the collective reads meanwhile, passed to the wait so the compiled graph keeps
    their memory untouched until then. After the wait the results are copied into
    ``targets`` (the caller's tensors, for the in-place form) or, without targets,
    returned (the differentiable form).
    """

    def __init__(
        self,
        results: list[torch.Tensor],
        reads: list[torch.Tensor],
        targets: list[torch.Tensor] | None,
        single: bool = True,
    ) -> None:
        self._results = results
        self._reads = reads
        self._targets = targets
        self._single = single
        self._done = False

    def wait(self) -> Any:
        """Wait for the collective at this point of the graph.

        Returns ``None`` for the in-place form; the result tensor (or list) otherwise.
        """
        if not self._done:
            n = len(self._results)
            waited = op("torchcomm_wait_tensors")([*self._results, *self._reads])
            self._results = list(waited[:n])
            self._done = True
            if self._targets is not None:
                for t, r in zip(self._targets, self._results, strict=True):
                    t.copy_(r)
        if self._targets is not None:
            return None
        return self._results[0] if self._single else list(self._results)

    def is_completed(self) -> bool:
        return self._done
