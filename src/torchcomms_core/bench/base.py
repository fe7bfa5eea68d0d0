"""``BenchOp``: what ``torchcomms bench`` needs to know about one operation to time and check it.

Subclasses size and allocate buffers, describe the test data, run the operation and its
``torch.distributed`` equivalent, and give the bus-bandwidth factor.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import torch

from torchcomms_core.bench.data import (
    IN_PLACE,
    OUT_OF_PLACE,
    Buffers,
    Case,
    count_wrong,
    fill,
    values,
)


class BenchOp(abc.ABC):
    """One benchmarked operation.

    Values are indexed by flat element index: ``input_values`` says what a rank puts in
    its input, ``expected_values`` what its output must hold after one run.
    """

    #: Name used by ``--ops`` and in the report.
    name: ClassVar[str]
    #: Whether the operation reduces (takes ``--op``); the report shows the redop.
    reduces: ClassVar[bool] = False
    #: Whether the operation has a root (takes ``--root``); the report shows it.
    rooted: ClassVar[bool] = False
    #: Whether buffers are split into one chunk per rank (count rounded to ``nranks``).
    splits: ClassVar[bool] = False
    #: The buffer layouts the operation has, each timed in its own pass.
    forms: ClassVar[tuple[str, ...]] = (OUT_OF_PLACE,)
    #: Whether data moves: ``False`` means no size, no bandwidth and nothing to check.
    moves_data: ClassVar[bool] = True
    #: Fewest ranks the operation needs.
    min_ranks: ClassVar[int] = 1
    #: A timed call is this many one-way operations (a ping-pong round trip is two).
    legs: ClassVar[int] = 1
    #: The ``torch.distributed`` function ``run_c10d`` calls; ``None`` when there is none.
    c10d_name: ClassVar[str | None] = None
    #: An older name of that function, for PyTorch releases that lack ``c10d_name``.
    c10d_older_name: ClassVar[str | None] = None

    def granule(self, nranks: int) -> int:
        """Element counts are rounded down to a multiple of this."""
        return nranks if self.splits else 1

    def count(self, nbytes: int, case: Case) -> int:
        """Elements of the largest buffer for a requested size of ``nbytes``."""
        if not self.moves_data:
            return 0
        count = nbytes // case.itemsize
        granule = self.granule(case.nranks)
        return max(count - count % granule, granule)

    @abc.abstractmethod
    def busbw_factor(self, nranks: int) -> float:
        """Bus bandwidth / algorithm bandwidth: the share of data that crosses the bus."""

    @abc.abstractmethod
    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        """Allocate the buffers for ``count`` elements in the largest buffer, laid out as
        ``form`` (default: the first of ``forms``)."""

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        """This rank's input at flat positions ``index``, in ``case.dtype``."""
        raise NotImplementedError

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        """This rank's output at flat positions ``index`` after one run, in ``case.dtype``."""
        raise NotImplementedError

    @abc.abstractmethod
    def run(self, comm: Any, bufs: Buffers, case: Case) -> None:
        """Run the operation once, to completion, on ``comm``."""

    def run_c10d(self, dist: Any, bufs: Buffers, case: Case) -> None:
        """Run the ``torch.distributed`` equivalent once on the default process group."""
        raise NotImplementedError(f"{self.name} has no torch.distributed equivalent")

    def fill(self, bufs: Buffers, case: Case) -> None:
        """Clear the output, then write this rank's test data into the input buffer."""
        # Test values are never zero, so output the operation failed to write mismatches.
        # Clearing first is right for in-place layouts too: the input is written last.
        bufs.output.zero_()
        fill(bufs.input, lambda index: self.input_values(index, bufs.count, case))

    def count_wrong(self, bufs: Buffers, case: Case) -> int:
        """Elements of this rank's output that differ from the exact expected result."""
        if not self.holds_result(case):
            return 0
        return count_wrong(bufs.output, lambda index: self.expected_values(index, bufs.count, case))

    def holds_result(self, case: Case) -> bool:
        """Whether this rank's output is defined after the operation (rooted ones: the root)."""
        return True

    def participates(self, case: Case) -> bool:
        """Whether this rank takes part; the others' times are left out of the statistics."""
        return True

    def refuses(self, dtype: torch.dtype, redop: str, nranks: int | None = None) -> str | None:
        """Why this operation cannot run with ``dtype``, ``redop`` and ``nranks``, or ``None``."""
        if nranks is not None and nranks < self.min_ranks:
            return f"needs at least {self.min_ranks} ranks, got {nranks}"
        return None

    def c10d_function_name(self, dist: Any) -> str | None:
        """The name of the ``torch.distributed`` function this PyTorch has for ``run_c10d``."""
        if self.c10d_name is None:
            return None
        if self.c10d_older_name is not None and not hasattr(dist, self.c10d_name):
            return self.c10d_older_name
        return self.c10d_name

    def c10d_refuses(self, case: Case, c10d_backend: str) -> str | None:
        """Why ``run_c10d`` cannot run here, or ``None`` when it can."""
        if self.c10d_name is None:
            return "no torch.distributed equivalent"
        return None

    def root_label(self, case: Case) -> int:
        return case.root if self.rooted else -1

    def redop_label(self, case: Case) -> str:
        return case.redop if self.reduces else "none"

    def forms_for(self, inplace: str) -> tuple[str, ...]:
        """The forms ``--inplace`` selects: ``0`` out-of-place, ``1`` in-place, ``both``.

        An operation with a single form runs it whatever ``--inplace`` says.
        """
        wanted = {"0": (OUT_OF_PLACE,), "1": (IN_PLACE,), "both": (OUT_OF_PLACE, IN_PLACE)}
        chosen = tuple(form for form in self.forms if form in wanted[inplace])
        return chosen or self.forms

    def _form(self, form: str | None) -> str:
        if form is None:
            return self.forms[0]
        if form not in self.forms:
            raise ValueError(f"{self.name} has no {form} form; it has {', '.join(self.forms)}")
        return form

    def _empty(self, numel: int, case: Case) -> torch.Tensor:
        return torch.empty(numel, dtype=case.dtype, device=case.device)


class PairOp(BenchOp):
    """A round trip between ranks 0 and 1 (two legs); the other ranks stand by.

    Rank 0's data goes to rank 1 and back: both end with it in their output.
    """

    min_ranks = 2
    legs = 2

    def busbw_factor(self, nranks: int) -> float:
        return 1.0

    def allocate(self, count: int, case: Case, form: str | None = None) -> Buffers:
        return Buffers(self._empty(count, case), self._empty(count, case), count, self._form(form))

    def input_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(case.rank, 0, index, case, reduced=False)

    def expected_values(self, index: torch.Tensor, count: int, case: Case) -> torch.Tensor:
        return values(0, 0, index, case, reduced=False)

    def participates(self, case: Case) -> bool:
        return case.rank < 2

    def holds_result(self, case: Case) -> bool:
        return case.rank < 2
