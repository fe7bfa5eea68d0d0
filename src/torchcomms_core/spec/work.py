"""Work combinators and tensor helpers: what the spec's defaults, the core and backends share.

:class:`MultiWork` waits for several works, :class:`ThenWork` (through :func:`then`) runs a
local step after one, :func:`settle` completes a work when the call was not asynchronous.
:func:`flat_chunks`, :func:`unflatten_into`, :func:`split_dim0` and :func:`reduce_rows`
are the tensor plumbing the portable defaults are built from; backends may use them too.

Imports: ``torch`` and ``torchcomms_core.operations`` only (the bottom of the spec package).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchcomms_core.operations.reduce_op import RedOpType


class MultiWork:
    """Completion handle over several works; ``wait()`` waits for all of them."""

    __slots__ = ("_works",)

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self) -> bool:
        """Wait for every work; return ``True``.

        Every work is waited on even when an earlier one failed, so none is left in flight.

        Raises:
            The first error a work raised, once all of them are settled.
        """
        first_error: BaseException | None = None
        for work in self._works:
            try:
                work.wait()
            except Exception as exc:  # keep waiting: every work must be settled
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error
        return True

    def is_completed(self) -> bool:
        """Whether every work reports completion; one without ``is_completed()`` counts as not."""
        return all(getattr(w, "is_completed", lambda: False)() for w in self._works)


class ThenWork:
    """Runs ``step`` after ``inner`` completes (a local post-processing stage)."""

    __slots__ = ("_inner", "_step", "_done")

    def __init__(self, inner: Any, step: Callable[[], None]) -> None:
        self._inner = inner
        self._step = step
        self._done = False

    def wait(self) -> bool:
        """Wait for ``inner``, then run ``step`` once (however often ``wait`` is called); ``True``.

        Raises:
            What ``inner.wait()`` or ``step`` raise; ``step`` does not run when ``inner`` failed.
        """
        if not self._done:
            self._inner.wait()
            self._step()
            self._done = True
        return True

    def is_completed(self) -> bool:
        """Whether ``step`` ran or ``inner`` reports completion (``wait()`` then runs ``step``)."""
        probe = getattr(self._inner, "is_completed", None)
        return self._done or (probe is not None and bool(probe()))


def then(work: Any, step: Callable[[], None]) -> Any:
    """Run ``step`` now if ``work`` is ``None`` (already done), else after it completes."""
    if work is None:
        step()
        return None
    return ThenWork(work, step)


def settle(work: Any, async_op: bool) -> Any:
    """What an operation returns: ``work`` when ``async_op``, else ``None`` once it completed.

    ``work`` may be ``None`` (nothing to wait for). Raises what ``work.wait()`` raises.
    """
    if work is not None and not async_op:
        work.wait()
        return None
    return work


def flat_chunks(tensor: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` equal flat views of ``tensor`` (empty views when it has no elements)."""
    flat = tensor.view(-1)
    if not flat.numel():
        return [flat] * n
    return list(flat.chunk(n))


def unflatten_into(flat: torch.Tensor, targets: Sequence[torch.Tensor]) -> Callable[[], None]:
    """A completion step copying consecutive pieces of ``flat`` back into ``targets``."""

    def step() -> None:
        offset = 0
        for t in targets:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n

    return step


def split_dim0(tensor: torch.Tensor, split_sizes: Sequence[int], n: int) -> list[torch.Tensor]:
    """Split ``tensor`` along dim 0 into ``n`` views (equal parts when ``split_sizes`` is empty)."""
    if tensor.dim() == 0:
        tensor = tensor.view(1)
    if not split_sizes:
        rows = tensor.shape[0] // n if n else 0
        split_sizes = [rows] * n
    return list(torch.split(tensor, list(split_sizes), dim=0))


def reduce_rows(rows: torch.Tensor, op_type: RedOpType) -> torch.Tensor:
    """Reduce the rows of a 2-D tensor in row order with a basic reduction."""
    acc = rows[0].clone()
    for i in range(1, rows.shape[0]):
        x = rows[i]
        if op_type is RedOpType.SUM:
            if acc.dtype == torch.bool:
                acc.logical_or_(x)
            else:
                acc.add_(x)
        elif op_type is RedOpType.PRODUCT:
            if acc.dtype == torch.bool:
                acc.logical_and_(x)
            else:
                acc.mul_(x)
        elif op_type is RedOpType.MIN:
            torch.minimum(acc, x, out=acc)
        elif op_type is RedOpType.MAX:
            torch.maximum(acc, x, out=acc)
        elif op_type is RedOpType.BAND:
            acc.bitwise_and_(x)
        elif op_type is RedOpType.BOR:
            acc.bitwise_or_(x)
        elif op_type is RedOpType.BXOR:
            acc.bitwise_xor_(x)
        else:
            raise ValueError(f"reduce_rows cannot apply {op_type!r}; the core resolves it first")
    return acc


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the memory of ``a`` and ``b`` overlaps (``False`` when either is empty).

    Compares the byte ranges from each tensor's first element: for contiguous tensors,
    exactly whether they alias (engines such as MPI refuse aliased buffers).
    """
    if not a.numel() or not b.numel():
        return False
    pa, pb = a.data_ptr(), b.data_ptr()
    return pa < pb + b.numel() * b.element_size() and pb < pa + a.numel() * a.element_size()
